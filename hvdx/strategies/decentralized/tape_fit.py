"""The spec ``DistributedGradientTape`` runs for an ``HVDX_SYNC`` decentralized value.

A tape returns the gradients before the optimizer applies them, so it can only mix
before the update (combine-then-adapt). A script launched with
``HVDX_SYNC="Decentralized(...)"`` that leaves ``order`` out cannot pass an argument to
its tape, and the same value keeps adapt-then-combine in a Keras optimizer; so the tape
runs that value with ``order="combine_then_adapt"`` (:func:`tape_fit`, the catalogue's
``tensorflow_tape_fit``).
"""

from __future__ import annotations

import inspect

from hvdx.core.group_averaging import ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT
from hvdx.environment_variables import call_of

__all__ = ["tape_fit", "with_order"]

#: The attribute of an ``HVDX_SYNC`` spec that keeps the spec its tapes run.
_TAPE_SPEC = "_hvdx_tape_spec"


def tape_fit(sync):
    """``sync`` as ``DistributedGradientTape`` runs it.

    A spec ``HVDX_SYNC`` built from a value that leaves ``order`` out runs
    combine-then-adapt. Its own arguments are kept, and it is one spec per value (kept
    on ``sync``): a tape is made every step, and its state lives on its spec. A spec
    from the code, or a value that names an order, runs as given (adapt-then-combine is
    refused by :meth:`hvdx.Decentralized.check_tape`).
    """
    if sync.environment is None or sync.order != ADAPT_THEN_COMBINE:
        return sync
    fitted = getattr(sync, _TAPE_SPEC, None)
    if fitted is None:
        given = _given(sync)
        if "order" in given:
            fitted = sync
        else:
            fitted = type(sync)(**dict(given, order=COMBINE_THEN_ADAPT))
            # The variable it came from, which the ranks compare (environment.parse).
            object.__setattr__(fitted, "environment", sync.environment)
        setattr(sync, _TAPE_SPEC, fitted)
    return fitted


def _given(sync) -> dict:
    """The arguments the ``HVDX_SYNC`` value that built ``sync`` gives, by name; the
    old name ``topology`` as ``graph`` (the value warned once, when it was read)."""
    _, args, kwargs = call_of(*sync.environment)
    given = dict(inspect.signature(type(sync)).bind(*args, **kwargs).arguments)
    if "topology" in given:
        given = {("graph" if key == "topology" else key): value
                 for key, value in given.items()}
    return given


def with_order(sync, order: str) -> str:
    """The ``HVDX_SYNC`` value that built ``sync``, with ``order`` instead of its own."""
    arguments = dict(_given(sync), order=order)
    return f"{type(sync).__name__}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
