"""The benchmark's picture: quality against training time, and step times."""

from __future__ import annotations

from typing import Dict, List

__all__ = ["plot", "plot_script"]


#: What a reader calls the floor run (every rank alone: no communication at all).
FLOOR_LABEL = "no communication (floor)"


def _label(strategy: str) -> str:
    return FLOOR_LABEL if strategy == "floor" else strategy


def plot(raw: List[Dict], rows, path: str) -> None:
    """One column per workload: quality against training time on top (test accuracy,
    or validation bits per byte for ``lm``), median step time bars below.

    The time axis is logarithmic: the fastest strategies reach their quality in a tenth
    of Horovod's time, and on a linear axis their curves crowd into its first tick."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on cluster nodes
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from hvdx.bench.workloads import WORKLOADS

    workloads = list(dict.fromkeys(r["workload"] for r in raw))
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.5 * len(workloads), 8),
                             squeeze=False)
    for col, workload in enumerate(workloads):
        top, bottom = axes[0][col], axes[1][col]
        metric = WORKLOADS[workload].metric
        for run in (r for r in raw if r["workload"] == workload):
            top.plot([p["time"] for p in run["curve"]], [p["quality"] for p in run["curve"]],
                     marker="o", markersize=3, label=_label(run["strategy"]),
                     linestyle="--" if run["strategy"] == "floor" else "-")
        target = next(r.target for r in rows if r.workload == workload)
        top.axhline(target, color="grey", linestyle=":", label=f"target {target:.2f}")
        top.set_xscale("log")
        # Ticks at 1, 2 and 5 of each decade, written as plain seconds (not 5x10^0).
        top.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        top.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        top.xaxis.set_minor_formatter(NullFormatter())
        top.set(title=workload, xlabel="training time (s, log scale)", ylabel=metric.name)
        top.legend(fontsize="small")
        bars = [r for r in rows if r.workload == workload]
        names = [_label(r.strategy).replace(" (", "\n(") for r in bars]
        bottom.bar(range(len(bars)), [1e3 * r.median_step_s for r in bars])
        bottom.set_xticks(range(len(bars)), names, rotation=30, ha="right",
                          fontsize="small")
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
