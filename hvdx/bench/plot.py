"""The benchmark's picture: test accuracy against training time, and step times."""

from __future__ import annotations

from typing import Dict, List

__all__ = ["plot", "plot_script"]


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


def plot_script(rows, path: str) -> None:
    """``hvdx bench --script``: median step time and wall time of the job, per strategy
    (a script has no accuracy curve to draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.strategy if r.placement in (None, "blocked") else f"{r.strategy}@{r.placement}"
             for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    left.bar(names, [1e3 * (r.median_step_s or 0.0) for r in rows])
    left.set(ylabel="median step time (ms)", title=rows[0].script if rows else "")
    right.bar(names, [r.wall_s for r in rows])
    right.set(ylabel="wall time of the job (s)")
    for axis in (left, right):
        axis.tick_params(axis="x", labelrotation=20)
    fig.suptitle(rows[0].network if rows else "")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
