"""TopK traffic against the number of ranks: ``hvdx bench --topk-bytes``.

Zou, De Sterck & Liu (arXiv 2209.15203) compress the downlink because, with ``P``
workers, the aggregate of ``P`` uplink selections holds up to ``P k`` entries: sent
back whole (unidirectional TopK, or every rank gathering every rank's pairs), the
downlink grows linearly in ``P``. hvdx's sharded mode keeps both directions at about
``k`` pairs per rank whatever ``P``.

One measurement, for each ``P`` in ``ranks`` and each mode:

1. an MPI job of ``P`` ranks (:func:`main`) trains the benchmark's communication-bound
   model (``digits_vgg``, 1.4 M parameters) for ``steps`` steps with
   ``Compression.topk(ratio, downlink_ratio, mode=...)``, on its real data;
2. each rank reads its optimizer's byte counters
   (:class:`hvdx.strategies.topk.core_counters.TopKStats`), split into uplink, downlink
   and dense (the small tensors Horovod averages), and the ranks' means per step are
   printed by rank 0 as one JSON line;
3. :func:`render` sets them against Horovod's dense ring allreduce of the same model,
   ``2 (P - 1) / P`` times its bytes each way.

The counts are hvdx's own (the buffers handed to MPI); ``hvdx bench`` checks them
against the emulated interfaces' byte counters at 4 ranks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Sequence

import numpy as np

from hvdx.bench.jobs import digits_job, report, run_job

__all__ = ["run", "render"]


def _one(mode: str, steps: int, ratio: float, downlink_ratio: float) -> Dict:
    import torch
    import torch.nn.functional as F

    hvd, workload, _, x, y, model, opt, _, size = digits_job(
        "digits_vgg",
        lambda hvd: {"compression": hvd.Compression.topk(ratio, downlink_ratio, mode=mode)})
    batch = workload.batch_size
    for step in range(steps):
        idx = torch.arange(step * batch, (step + 1) * batch) % len(x)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    phases = opt.hvdx_stats.phases
    # The downlink's bytes include sharded mode's agreement on the global TopK.
    down = [phases["down"][i] + phases["agree"][i] for i in (0, 1)]
    mine = np.array(phases["up"] + down + phases["dense"], dtype=np.float64) / steps
    everyone = np.array(hvd.allgather_object(mine.tolist()))
    mean = everyone.mean(axis=0)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"ranks": size, "mode": opt.hvdx_mode, "steps": steps,
            "ratio": ratio, "downlink_ratio": downlink_ratio, "model_bytes": model_bytes,
            "up_sent": mean[0], "up_received": mean[1], "down_sent": mean[2],
            "down_received": mean[3], "dense_sent": mean[4], "dense_received": mean[5],
            "max_rank_sent": float(everyone[:, [0, 2, 4]].sum(axis=1).max())}


def run(ranks: Sequence[int] = (2, 4, 8), modes: Sequence[str] = ("gathered", "sharded"),
        steps: int = 5, ratio: float = 0.01, downlink_ratio: float = 0.01,
        say: Callable[[str], None] = print) -> List[Dict]:
    """Run every (ranks, mode) case as its own ``mpirun`` job on this host."""
    rows = []
    for n in ranks:
        for mode in modes:
            say(f"topk bytes: {n} ranks, mode={mode}, {steps} steps")
            command = ["mpirun", "-n", str(n), sys.executable, "-m", "hvdx.bench.topk_bytes",
                       "--mode", mode, "--steps", str(steps), "--ratio", str(ratio),
                       "--downlink-ratio", str(downlink_ratio)]
            rows.append(run_job(command, f"topk bytes at {n} ranks, mode={mode}"))
    return rows


def render(rows: List[Dict]) -> str:
    """Kilobytes per rank per step by direction, and the larger way against Horovod's."""
    lines = ["| ranks | mode | up sent | up received | down sent | down received | dense | "
             "total sent | total received | Horovod each way | % of Horovod |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["ranks"]
        horovod = 2 * (p - 1) / p * r["model_bytes"]
        sent = r["up_sent"] + r["down_sent"] + r["dense_sent"]
        received = r["up_received"] + r["down_received"] + r["dense_received"]
        cells = [r[k] / 1e3 for k in ("up_sent", "up_received", "down_sent", "down_received",
                                      "dense_sent")] + [sent / 1e3, received / 1e3,
                                                        horovod / 1e3]
        lines.append(f"| {p} | {r['mode']} | " + " | ".join(f"{c:.1f}" for c in cells) +
                     f" | {100 * max(sent, received) / horovod:.2f} |")
    return "\n".join(lines) + "\n(KB per rank per step, mean over ranks)"


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of the TopK traffic measurement")
    parser.add_argument("--mode", choices=("gathered", "sharded"), required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ratio", type=float, default=0.01)
    parser.add_argument("--downlink-ratio", type=float, default=0.01)
    args = parser.parse_args(argv)
    result = _one(args.mode, args.steps, args.ratio, args.downlink_ratio)
    report(result)


if __name__ == "__main__":
    main()
