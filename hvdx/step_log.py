"""Optimizer step times of an unchanged script, for ``hvdx bench --script``.

When ``HVDX_BENCH_STEP_LOG=<prefix>`` is set, hvdx records ``time.monotonic()`` after
each optimizer step: torch's ``DistributedOptimizer`` after ``step()``
(:func:`watch_torch`); TensorFlow's ``DistributedGradientTape`` after ``gradient()`` and
Keras' ``DistributedOptimizer`` after ``apply_gradients()`` (:func:`watch_tensorflow`),
eagerly or inside a ``tf.function`` (``model.fit``'s included). Each rank writes
``<prefix>.rank<R>.json`` when its process exits (``atexit``): the timestamps of every
watched optimizer, its parameter bytes and hvdx's byte counters (``hvdx_stats``) where
the strategy has them. ``hvdx bench --script`` reads these files to report the median
step without touching the script (:func:`read`, :func:`median_step`).

Unset, nothing is installed: the optimizer (or tape) is Horovod's (or hvdx's) object as
it was, with no hook and no cost.
"""

from __future__ import annotations

import atexit
import functools
import glob
import json
import os
import statistics
import time
import weakref
from typing import Callable, Dict, List, Optional

from hvdx.atomic_file import write_atomically

__all__ = ["VARIABLE", "Watch", "intervals", "main_optimizer", "median_step", "path_of",
           "read", "watch_tensorflow", "watch_torch"]

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
    figures = {"rank": _RANK[0], "optimizers": [w.figures() for w in _WATCHES]}
    try:
        write_atomically(path, json.dumps(figures).encode())
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


# --- TensorFlow ---------------------------------------------------------------------------

#: ``key -> (weak references to the variables, Watch)``: one watch per Keras optimizer,
#: and one per list of variables for tapes (an eager loop builds a tape every step).
_TF_WATCHES: Dict[tuple, tuple] = {}


class _Counters:
    """A tape's stand-in for :attr:`Watch.optimizer`: what :meth:`Watch.figures` reads."""

    def __init__(self, hvdx_stats):
        if hvdx_stats is not None:
            self.hvdx_stats = hvdx_stats


def _tf_watch(key, referents, variables, rank, make_owner) -> Watch:
    """The watch for ``key`` (made, and registered, at its first call); ``referents``:
    the objects whose ids make the key (checked alive, as ids may be reused)."""
    entry = _TF_WATCHES.get(key)
    if entry is not None and all(r() is v for r, v in zip(entry[0], referents)):
        return entry[1]
    nbytes = sum((v.shape.num_elements() or 0) * v.dtype.size for v in variables)
    watch = Watch(make_owner(), nbytes)
    _TF_WATCHES[key] = ([weakref.ref(v) for v in referents], watch)
    _register(rank() if callable(rank) else rank, watch)
    return watch


def _stamp(tf, watch: Watch, after) -> None:
    """Record now (eagerly), or add to the graph being traced an op that records each
    time it runs, after the tensors of ``after``: a stateful ``tf.numpy_function``,
    which a ``tf.function`` runs on every call even though nothing consumes it."""
    if tf.executing_eagerly():
        watch.record()
        return
    ready = []
    for x in tf.nest.flatten(after):
        if isinstance(x, tf.IndexedSlices):
            x = x.values
        elif isinstance(x, tf.Variable):
            x = x.value()  # read after this step's updates of it (automatic control deps)
        if isinstance(x, (tf.Tensor, tf.Operation)):
            ready.append(x)

    def record():
        watch.record()
        return watch.times[-1]

    with tf.control_dependencies(ready):
        tf.numpy_function(record, [], tf.float64, stateful=True, name="hvdx_step_log")


def watch_tensorflow(owner, rank, stats_of: Optional[Callable] = None):
    """``owner``, timed after every step when :data:`VARIABLE` is set.

    ``owner``: a gradient tape (timed after each ``gradient()``, once its gradients are
    reduced) or a Keras optimizer (after each ``apply_gradients()``, once the variables
    are updated); ``rank``: this process's rank, or a function returning it;
    ``stats_of(tape, variables)``, tapes only: the strategy's byte counters, or ``None``
    (a Keras optimizer carries its own ``hvdx_stats``).

    The method is shadowed on this instance only (its class is untouched). Eagerly the
    time is taken at once; inside a ``tf.function`` (``model.fit``) an op that takes it
    is added, so that it is taken on every step that runs, not only when traced. A tape
    built every step (eagerly) records into the watch of its variables.
    """
    if not os.environ.get(VARIABLE):
        return owner
    import tensorflow as tf

    tape = isinstance(owner, tf.GradientTape)
    method = "gradient" if tape else "apply_gradients"
    original = getattr(owner, method)

    @tf.autograph.experimental.do_not_convert  # trace-time Python: nothing to convert
    @functools.wraps(original)
    def timed(*args, **kwargs):
        if tape:
            variables = tf.nest.flatten(kwargs["sources"] if "sources" in kwargs else args[1])
            result = original(*args, **kwargs)
            watch = _tf_watch(
                ("tape",) + tuple(id(v) for v in variables), variables, variables, rank,
                lambda: _Counters(stats_of(owner, variables) if stats_of else None))
            _stamp(tf, watch, result)
            return result
        # A zip is read once: hand the optimizer the list read here.
        if "grads_and_vars" in kwargs:
            kwargs["grads_and_vars"] = pairs = list(kwargs["grads_and_vars"])
        else:
            pairs = list(args[0])
            args = (pairs,) + args[1:]
        variables = [v for g, v in pairs if g is not None]
        result = original(*args, **kwargs)
        watch = _tf_watch(("optimizer", id(owner)), [owner], variables, rank,
                          lambda: owner)
        _stamp(tf, watch, [result] + variables)
        return result

    object.__setattr__(owner, method, timed)
    return owner


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
    gaps = intervals(times)
    return statistics.median(gaps) if gaps else None
