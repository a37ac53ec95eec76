"""What decentralized SGD's exchange adds to a step: ``hvdx bench --overlap``.

The bar: on localhost, a step with the exchange takes at most 1.1x a step
without any exchange. Two orders of ``hvdx.Decentralized`` (one-peer exponential graph)
are timed against the same training loop with the local optimizer alone:

- ``local``: ``torch.optim.SGD`` only, no exchange (the floor);
- ``atc``: adapt-then-combine: the new parameters are sent right after the local step
  and combined before the next forward pass reads them;
- ``cta``: combine-then-adapt: they are sent when the step ends and combined in the
  next ``step()``, so the exchange runs during the forward and backward pass.

One measurement (one MPI job on this host per workload, :func:`main`):

1. ``hvd.init()`` with Horovod's cycle at 50 ms
   (:data:`hvdx.strategies.topk.presets.HOROVOD_CYCLE_ENV`: nothing of Horovod's runs in a step)
   for every mode alike; each mode gets
   its own copy of the same initial model (broadcast from rank 0) and optimizer;
2. the modes take turns in blocks of ``steps / rounds`` training steps on the same
   batches, so that the machine's noise (2 shared cores) falls on all of them alike;
   every block starts after a barrier and ends by completing the exchange in flight
   (``synchronize()``), whose time is added to the block's last step;
3. each step (``zero_grad``, forward, backward, ``step()``) is timed on every rank; the
   first step of each block is dropped (the switch between models); rank 0 reports the
   median and mean over every rank's remaining steps, and the bytes each rank sent per
   step by hvdx's count.

:func:`render` prints each mode's median step against ``local``'s.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Callable, Dict, List, Sequence

import numpy as np

from hvdx.bench.jobs import digits_setup, report, run_job

__all__ = ["MODES", "render", "run"]

#: mode -> ``hvdx.Decentralized`` options (``None``: the local optimizer alone).
MODES: Dict[str, object] = {
    "local": None,
    "atc": {"graph": "one-peer-exp", "order": "adapt_then_combine"},
    "cta": {"graph": "one-peer-exp", "order": "combine_then_adapt"},
}


def _one(workload_name: str, steps: int, rounds: int, modes: Sequence[str],
         seed: int = 42) -> Dict:
    import torch
    import torch.nn.functional as F

    import hvdx

    hvd, workload, _, x, y, base, _, rank, size = digits_setup(workload_name, seed)

    runs = {}
    for mode in modes:
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=workload.lr * size, momentum=0.9)
        if MODES[mode] is not None:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           sync=hvdx.Decentralized(**MODES[mode]),
                                           named_buffers=model.named_buffers())
        runs[mode] = {"model": model, "opt": opt, "times": [], "steps": 0}

    batch = workload.batch_size
    per_block = max(2, steps // rounds)
    rng = np.random.default_rng(seed + rank)
    batches = [torch.from_numpy(rng.integers(0, len(x), batch)) for _ in range(per_block)]
    for _ in range(rounds):
        for mode in modes:
            run = runs[mode]
            model, opt = run["model"], run["opt"]
            hvd.barrier()
            block = []
            for idx in batches:
                start = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                block.append(time.perf_counter() - start)
            if hasattr(opt, "hvdx_stats"):
                # The exchange still in flight belongs to this block: complete it, and
                # charge its wait to the last step (the next forward would wait for it).
                start = time.perf_counter()
                opt.synchronize()
                block[-1] += time.perf_counter() - start
            run["times"] += block[1:]
            run["steps"] += len(block)

    mine = {}
    for mode in modes:
        run = runs[mode]
        stats = getattr(run["opt"], "hvdx_stats", None)
        mine[mode] = {"times": run["times"],
                      "sent": stats.total_bytes / run["steps"] if stats else 0.0}
    everyone = hvd.allgather_object(mine)
    model_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    result = {"workload": workload_name, "ranks": size, "steps_per_mode": per_block * rounds,
              "rounds": rounds, "model_bytes": model_bytes, "modes": {}}
    for mode in modes:
        times = np.concatenate([r[mode]["times"] for r in everyone])
        result["modes"][mode] = {
            "median_s": float(np.median(times)), "mean_s": float(np.mean(times)),
            "timed_steps": int(len(times)),
            "sent_per_step": float(np.mean([r[mode]["sent"] for r in everyone]))}
    return result


def run(workloads: Sequence[str] = ("digits_vgg",), ranks: int = 4, steps: int = 60,
        rounds: int = 4, modes: Sequence[str] = tuple(MODES),
        say: Callable[[str], None] = print, timeout: float = 900.0) -> List[Dict]:
    """One ``mpirun`` job of ``ranks`` ranks on this host per workload."""
    from hvdx.strategies.topk.presets import HOROVOD_CYCLE_ENV
    from hvdx.bench.workloads import WORKLOADS

    for name in workloads:
        if name not in WORKLOADS:
            raise ValueError(f"workload={name!r} is unknown; choose from {sorted(WORKLOADS)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown; choose from {', '.join(MODES)}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"--ranks={ranks!r} must be at least 2 (an exchange needs a peer)")
    rows = []
    for name in workloads:
        say(f"overlap: {name}, {ranks} ranks, {steps} steps per mode "
            f"({', '.join(modes)}, {rounds} rounds)")
        command = ["mpirun", "-n", str(ranks), sys.executable, "-m", "hvdx.bench.overlap",
                   "--workload", name, "--steps", str(steps), "--rounds", str(rounds),
                   "--modes", ",".join(modes)]
        rows.append(run_job(command, f"overlap measurement of {name}", timeout=timeout,
                            env=dict(HOROVOD_CYCLE_ENV, OMP_NUM_THREADS="1")))
    return rows


def render(rows: List[Dict]) -> str:
    """One line per workload and mode; ratios against the local optimizer alone."""
    lines = ["| workload | mode | median step ms | mean step ms | x local (median) | "
             "x local (mean) | MB sent/rank/step |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        local = r["modes"].get("local")
        for mode, m in r["modes"].items():
            ratio = mean_ratio = "-"
            if local:
                ratio = f"{m['median_s'] / local['median_s']:.3f}"
                mean_ratio = f"{m['mean_s'] / local['mean_s']:.3f}"
            lines.append(f"| {r['workload']} | {mode} | {1e3 * m['median_s']:.1f} | "
                         f"{1e3 * m['mean_s']:.1f} | {ratio} | {mean_ratio} | "
                         f"{m['sent_per_step'] / 1e6:.3f} |")
    lines.append("(steps of every rank pooled; the bar: x local <= 1.1; "
                 "one model is " + ", ".join(f"{r['workload']} {r['model_bytes'] / 1e6:.2f} MB"
                                               for r in rows) + ")")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of the overlap measurement")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--steps", type=int, default=60, help="steps per mode")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    report(_one(args.workload, args.steps, args.rounds, args.modes.split(",")))


if __name__ == "__main__":
    main()
