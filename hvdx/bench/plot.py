"""The benchmark's picture: test accuracy against training time, and step times."""

from __future__ import annotations

from typing import Dict, List

__all__ = ["plot"]


def plot(raw: List[Dict], rows, path: str) -> None:
    """One column per workload: accuracy curves on top, median step time bars below."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on cluster nodes
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in raw))
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 7),
                             squeeze=False)
    for col, workload in enumerate(workloads):
        top, bottom = axes[0][col], axes[1][col]
        runs = [r for r in raw if r["workload"] == workload]
        for run in runs:
            top.plot([p["time"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]],
                     marker="o", markersize=3, label=run["strategy"])
        target = next(r.target_accuracy for r in rows if r.workload == workload)
        top.axhline(target, color="grey", linestyle=":", label=f"target {target:.2f}")
        top.set(title=workload, xlabel="training time (s)", ylabel="test accuracy")
        top.legend()
        bars = [r for r in rows if r.workload == workload]
        bottom.bar([r.strategy for r in bars], [1e3 * r.median_step_s for r in bars])
        bottom.set(ylabel="median step time (ms)")
    fig.suptitle(rows[0].network if rows else "")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
