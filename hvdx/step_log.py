"""Optimizer step times of an unchanged script, for ``hvdx bench --script``.

When ``HVDX_BENCH_STEP_LOG=<prefix>`` is set, hvdx's ``DistributedOptimizer`` (torch)
records ``time.monotonic()`` after each optimizer step, and each rank writes
``<prefix>.rank<R>.json`` when its process exits (``atexit``): the timestamps of every
watched optimizer, its parameter bytes and hvdx's byte counters (``hvdx_stats``) where
the strategy has them. ``hvdx bench --script`` reads these files to report the median
step without touching the script (:func:`read`, :func:`median_step`).

Unset, nothing is installed: the optimizer is Horovod's (or hvdx's) object as it was,
with no hook and no cost.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import time
from typing import Dict, List, Optional

__all__ = ["VARIABLE", "Watch", "intervals", "main_optimizer", "median_step", "path_of",
           "read", "watch_torch"]

VARIABLE = "HVDX_BENCH_STEP_LOG"

#: The counters of ``hvdx_stats`` written at exit, where the strategy has them.
COUNTERS = ("total_sent", "total_received", "total_bytes", "steps")


def path_of(prefix: str, rank: int) -> str:
    """The file rank ``rank`` writes for ``prefix``."""
    return f"{prefix}.rank{rank}.json"


class Watch:
    """The step times of one optimizer, and what is read from it at exit."""

    def __init__(self, optimizer, parameter_bytes: int):
        self.optimizer = optimizer
        self.parameter_bytes = int(parameter_bytes)
        self.times: List[float] = []
        self.depth = 0  # torch fires a subclass's hooks once per step() in the chain

    def record(self) -> None:
        self.times.append(time.monotonic())

    def figures(self) -> Dict:
        stats = getattr(self.optimizer, "hvdx_stats", None)
        counters = None
        if stats is not None:
            counters = {k: float(getattr(stats, k)) for k in COUNTERS if hasattr(stats, k)}
        return {"times": self.times, "parameter_bytes": self.parameter_bytes,
                "hvdx_stats": counters}


_WATCHES: List[Watch] = []
_RANK: List[int] = []


def _write(prefix: str) -> None:
    if not _RANK:
        return
    path = path_of(prefix, _RANK[0])
    try:
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": _RANK[0], "optimizers": [w.figures() for w in _WATCHES]}, f)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # a benchmark's figure, never a reason for a training script to fail


def _register(rank: int, watch: Watch) -> None:
    prefix = os.environ[VARIABLE]
    if not _RANK:
        _RANK.append(int(rank))
        atexit.register(_write, prefix)
    _WATCHES.append(watch)


def watch_torch(optimizer, rank):
    """``optimizer``, timed after every ``step()`` when :data:`VARIABLE` is set;
    ``rank``: this process's rank, or a function returning it (called only then).

    Uses torch's per-instance step hooks: the object is the same, its class too. Torch
    runs a subclass's hooks in every ``step()`` of the chain (Horovod's optimizer calls
    its base class's), so only the outermost one records.
    """
    if not os.environ.get(VARIABLE) or not hasattr(optimizer, "register_step_post_hook"):
        return optimizer
    nbytes = sum(p.numel() * p.element_size() for group in optimizer.param_groups
                 for p in group["params"] if p.requires_grad)
    watch = Watch(optimizer, nbytes)
    rank = rank() if callable(rank) else rank

    def before(*_):
        watch.depth += 1

    def after(*_):
        watch.depth -= 1
        if watch.depth == 0:
            watch.record()

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)
    _register(rank, watch)
    return optimizer


# --- reading, for the benchmark ---------------------------------------------------------

def read(prefix: str) -> Dict[int, Dict]:
    """``{rank: that rank's file}`` for every file written under ``prefix``."""
    logs = {}
    for path in glob.glob(glob.escape(prefix) + ".rank*.json"):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        logs[int(data["rank"])] = data
    return dict(sorted(logs.items()))


def main_optimizer(log: Dict) -> Optional[Dict]:
    """The optimizer of a rank's file that stepped most (a script may make several)."""
    optimizers = log.get("optimizers") or []
    return max(optimizers, key=lambda o: len(o["times"]), default=None)


def intervals(times: List[float]) -> List[float]:
    """Seconds between consecutive steps: one step each (data, forward, backward and
    the optimizer's step, as the script runs them)."""
    return [b - a for a, b in zip(times, times[1:])]


def median_step(times: List[float]) -> Optional[float]:
    """The median of :func:`intervals`; ``None`` with fewer than two steps."""
    gaps = sorted(intervals(times))
    if not gaps:
        return None
    mid = len(gaps) // 2
    return gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2
