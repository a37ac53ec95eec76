"""What a plan may claim: strategies it cannot tell apart, and steps that are mostly compute.

The calibrated plan's error against measured steps is within :data:`PLAN_TOLERANCE` on
the communication-bound workload (docs/benchmarks.md, "The planner against the
measurements"); on the compute-bound one it was not: there every strategy's step is
nearly its local step, measured on shared cores where it moves by a quarter between
runs, and the plan named a strategy that took twice as long as the fastest. So a
verdict:

1. takes as tied with the fastest every strategy whose predicted time per batch is
   within ``1 + PLAN_TOLERANCE`` of it (:func:`tied`);
2. measures how much of a step is wire the compute does not hide (:func:`wire_share`);
3. names one winner only when nothing is tied with it, and says the step is mostly
   compute when the fastest's wire share is under :data:`COMPUTE_BOUND_WIRE_SHARE`:
   then the ranking rests on the local steps, not on the network.
"""

from __future__ import annotations

from typing import List, Mapping

__all__ = ["COMPUTE_BOUND_WIRE_SHARE", "PLAN_TOLERANCE", "compute_bound", "tied",
           "wire_share"]

#: The plan's error bar: all 42 rows of six calibrated runs of digits_vgg were within it.
PLAN_TOLERANCE = 0.20
#: Below this share of wire in the fastest strategy's step, the step is mostly compute.
COMPUTE_BOUND_WIRE_SHARE = 0.25


def tied(per_batch: Mapping[str, float], tolerance: float = PLAN_TOLERANCE) -> List[str]:
    """The names whose time per batch is within ``1 + tolerance`` of the least, fastest
    first (ties in the mapping's order); the fastest is always first.

    Raises:
        ValueError: for an empty mapping, a time that is not positive, or a negative
            tolerance.
    """
    if not per_batch:
        raise ValueError("per_batch={}: no strategy to rank")
    if tolerance < 0:
        raise ValueError(f"tolerance={tolerance!r} must be >= 0")
    for name, seconds in per_batch.items():
        if not seconds > 0:
            raise ValueError(f"per_batch[{name!r}]={seconds!r} must be a positive time")
    order = sorted(per_batch, key=per_batch.get)
    best = per_batch[order[0]]
    return [name for name in order if per_batch[name] <= best * (1.0 + tolerance)]


def wire_share(step_s: float, compute_s: float) -> float:
    """The share of a predicted step that is wire nothing hides, in [0, 1]: the step
    less its compute (or measured local step), over the step. Where communication
    overlaps the compute, that is only what the wire adds beyond the compute.

    Raises:
        ValueError: for a step that is not a positive time.
    """
    if not step_s > 0:
        raise ValueError(f"step_s={step_s!r} must be a positive time")
    return min(1.0, max(0.0, (step_s - compute_s) / step_s))


def compute_bound(step_s: float, compute_s: float) -> bool:
    """Whether a predicted step is mostly compute: its :func:`wire_share` is under
    :data:`COMPUTE_BOUND_WIRE_SHARE`. With any strategy tied with the fastest, a verdict
    then names no winner (step 3 above)."""
    return wire_share(step_s, compute_s) < COMPUTE_BOUND_WIRE_SHARE
