"""A long run of every strategy: memory that keeps growing, ranks that drift apart.

``hvdx bench --soak`` (or ``bash scripts/soak``) trains the digits CNN for ``--steps``
steps (2,000 by default) at ``--ranks`` ranks on this host, once per strategy, and
reports per strategy:

1. the resident memory (RSS) of every rank at the end of the warm-up (the first 10% of
   the steps) and at the end; the growth in between, the largest over the ranks, must
   stay within 5%;
2. the drift between ranks: ``max |x_i - x_0|`` over the parameters at the end. Horovod
   and TopK keep the ranks bitwise identical (0); DS-Sync and decentralized SGD keep
   local parameters, so their spread is the consensus distance
   ``sqrt(mean_i ||x_i - mean_j x_j||^2)``, measured ten times after the warm-up, which
   must stay bounded: at the end at most 1.5x its largest value in the first half;
3. the median step time, and the final test accuracy.

One MPI job per strategy (:func:`run`); the table (:func:`render`) is what the README
quotes.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Sequence

import numpy as np

from hvdx.bench.jobs import digits_job, report, run_job
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load

__all__ = ["STRATEGIES", "render", "run"]

def _strategies() -> tuple:
    return ("horovod",) + tuple(d.name for d in catalogue.BUILT_IN if d.soak is not None)


#: Horovod, then the catalogue's strategies that say what the soak trains them with
#: (their descriptor's ``soak``: a value of their variable, ``HVDX_COMPRESSION`` or
#: ``HVDX_SYNC``).
STRATEGIES = _strategies()


def _options(name: str, hvd, hvdx) -> Dict:
    """``DistributedOptimizer``'s keyword arguments for strategy ``name`` (built on each
    rank): its descriptor's ``soak`` value, built by its constructor (a compressor by
    the framework's ``hvd.Compression``)."""
    from hvdx.environment_variables import call_of

    if name == "horovod":
        return {}
    known = _strategies()
    if name not in known:
        raise ValueError(f"strategy={name!r} is unknown; choose from {', '.join(known)}")
    entry = catalogue.descriptor(name)
    called, args, kwargs = call_of(entry.variable, entry.soak)
    if entry.kind == "compression":
        constructor = getattr(hvd.Compression, called)
    else:
        constructor = load(catalogue.environment_constructors(entry.variable)[called][0].build)
    return {entry.kind: constructor(*args, **kwargs)}


def _mixes(name: str) -> bool:
    """Whether the ranks keep their own parameters (a sync strategy: DS-Sync, the
    graphs), so that their drift is a consensus distance, not 0."""
    return name != "horovod" and catalogue.descriptor(name).kind == "sync"


def _spread(params, hvd) -> Dict[str, float]:
    """Largest difference from rank 0, and the consensus distance (collective)."""
    import torch

    flat = torch.cat([p.detach().reshape(-1).double() for p in params])
    everyone = hvd.allgather(flat.reshape(1, -1), name="hvdx.soak.spread")
    mean = everyone.mean(dim=0)
    return {"max_diff": float((everyone - everyone[0]).abs().max()),
            "consensus": float(((everyone - mean) ** 2).sum(dim=1).mean().sqrt())}


def _one(strategy: str, steps: int, seed: int = 0) -> Dict:
    import psutil
    import torch
    import torch.nn.functional as F

    import hvdx

    hvd, workload, data, x, y, model, opt, rank, size = digits_job(
        "digits_cnn", lambda hvd: _options(strategy, hvd, hvdx), seed,
        process_sets="dynamic")
    process = psutil.Process()
    warm = max(1, steps // 10)
    rng = np.random.default_rng(seed + rank)
    times, rss_warm, consensus = [], None, []
    probes = set(np.linspace(warm, steps, 10).astype(int).tolist())
    for step in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(x), workload.batch_size))
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        times.append(time.perf_counter() - start)
        if step + 1 in probes or step + 1 == warm:
            if hasattr(opt, "finish_mixing"):
                opt.finish_mixing()  # the mixing step in flight belongs to this one
            if step + 1 == warm:
                rss_warm = process.memory_info().rss
            if step + 1 in probes:
                consensus.append(_spread(model.parameters(), hvd)["consensus"])
    rss_end = process.memory_info().rss
    spread = _spread(model.parameters(), hvd)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(data.x_test)).argmax(1) ==
                          torch.from_numpy(data.y_test)).double().mean())
    mine = {"rss_warm": rss_warm, "rss_end": rss_end, "median_s": float(np.median(times)),
            "accuracy": accuracy}
    everyone = hvd.allgather_object(mine)
    return {"strategy": strategy, "ranks": size, "steps": steps, "warm_steps": warm,
            "growth": max((r["rss_end"] - r["rss_warm"]) / r["rss_warm"] for r in everyone),
            "rss_end_mb": max(r["rss_end"] for r in everyone) / 2 ** 20,
            "median_step_s": float(np.median([r["median_s"] for r in everyone])),
            "accuracy": float(np.mean([r["accuracy"] for r in everyone])),
            "max_diff": spread["max_diff"], "consensus": spread["consensus"],
            "consensus_path": consensus,
            "param_norm": float(torch.cat([p.detach().reshape(-1).double()
                                           for p in model.parameters()]).norm())}


def run(strategies: Sequence[str] = STRATEGIES, ranks: int = 4, steps: int = 2000,
        say: Callable[[str], None] = print, timeout: float = 1800.0) -> List[Dict]:
    """One ``mpirun`` job of ``ranks`` ranks on this host per strategy."""
    for name in strategies:
        if name not in STRATEGIES:
            raise ValueError(f"strategy={name!r} is unknown; choose from "
                             f"{', '.join(STRATEGIES)}")
    rows = []
    for name in strategies:
        say(f"soak: {name}, {ranks} ranks, {steps} steps")
        command = ["mpirun", "-n", str(ranks), sys.executable, "-m", "hvdx.bench.soak",
                   "--strategy", name, "--steps", str(steps)]
        rows.append(run_job(command, f"soak of {name}", timeout=timeout,
                            env={"OMP_NUM_THREADS": "1"}))
    return rows


def render(rows: List[Dict]) -> str:
    """One line per strategy, with the verdicts of the module docstring."""
    lines = ["| strategy | steps | RSS growth after warm-up | RSS MB | max |x_i - x_0| | "
             "consensus distance, first half max / end (of |x|) | median step ms | "
             "test acc | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        path = r["consensus_path"]
        first_half = max(path[:max(1, len(path) // 2)])
        if _mixes(r["strategy"]):
            drift_ok = r["consensus"] <= 1.5 * first_half
        else:
            drift_ok = r["max_diff"] == 0
        ok = r["growth"] <= 0.05 and drift_ok
        lines.append(
            f"| {r['strategy']} | {r['steps']} | {100 * r['growth']:+.1f}% | "
            f"{r['rss_end_mb']:.0f} | {r['max_diff']:.3g} | "
            f"{first_half:.3g} / {r['consensus']:.3g} ({r['consensus'] / r['param_norm']:.2%}) | "
            f"{1e3 * r['median_step_s']:.1f} | {r['accuracy']:.3f} | "
            f"{'ok' if ok else 'FAILS'} |")
    lines.append("(growth: the largest over the ranks, bar 5%; drift: bitwise 0 for Horovod "
                 "and TopK; for the mixing strategies the consensus distance must not trend "
                 "up: at the end at most 1.5x its largest value in the first half)")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of the soak run")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args(argv)
    report(_one(args.strategy, args.steps))


if __name__ == "__main__":
    main()
