"""Which TensorFlow adapter runs which hvdx strategy, as the catalogue says
(:mod:`hvdx.strategies.catalogue`: each descriptor's ``tensorflow_tape`` and
``tensorflow_keras``; a new strategy changes nothing here).

The entry points (:func:`hvdx.tensorflow.DistributedGradientTape`,
:func:`hvdx.tensorflow.keras.DistributedOptimizer`) find the strategy among their
arguments (:func:`hvdx.strategy.strategy_of`) and call :func:`tape` or :func:`keras`.
Each adapter gets ``horovod()``, a function that builds Horovod's own tape or optimizer
from the user's arguments: a compression strategy (TopK) installs itself on that object;
a synchronization strategy (DS-Sync, graphs: :mod:`hvdx.tensorflow.mixing`) replaces it and checks its variables across
ranks itself, when it first sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from hvdx.strategies import catalogue
from hvdx.strategy import Strategy, adapter_for, kept_for_every_rank

__all__ = ["GradientArguments", "KERAS_ADAPTERS", "TAPE_ADAPTERS", "TAPE_COUNTERS",
           "checks_its_own_variables", "keras", "tape", "tape_counters",
           "with_deferred_error"]


class GradientArguments(NamedTuple):
    """The Horovod arguments that an adapter may honour or refuse."""

    compression: Any
    op: Any
    gradient_predivide_factor: float
    process_set: Any
    #: ``non_trainable_variables=``: what parameter mixing averages besides the trained
    #: variables (BatchNorm moving statistics).
    non_trainable_variables: Any = None
    #: Keras only: Horovod's local aggregation of several backward passes per step,
    #: which parameter mixing honours too (one local step and one mix every N passes).
    backward_passes_per_step: int = 1
    average_aggregated_gradients: bool = False
    sparse_as_dense: bool = False
    scale_local_gradients: bool = True

    def aggregation(self) -> Dict[str, Any]:
        """The Keras aggregation arguments, as keywords."""
        return dict(backward_passes_per_step=self.backward_passes_per_step,
                    average_aggregated_gradients=self.average_aggregated_gradients,
                    sparse_as_dense=self.sparse_as_dense,
                    scale_local_gradients=self.scale_local_gradients)


#: Strategy name -> ``adapter(horovod, strategy, arguments, user_object)``: live views
#: of the catalogue's ``tensorflow_tape`` and ``tensorflow_keras`` entries
#: (:mod:`hvdx.strategies.catalogue`; a registered compressor's included).
TAPE_ADAPTERS: Mapping[str, Callable] = catalogue.adapters("tensorflow_tape")
KERAS_ADAPTERS: Mapping[str, Callable] = catalogue.adapters("tensorflow_keras")


def _build(table: Mapping[str, Callable], what: str, horovod: Callable,
           strategy: Optional[Strategy], args: GradientArguments, user):
    if strategy is None:
        return horovod()
    built = adapter_for(table, strategy, what)(horovod, strategy, args, user)
    from hvdx.tensorflow.join_guard import track

    track(strategy)  # hvd.join() refuses from now on (hvdx.tensorflow.join_guard)
    return built


def with_deferred_error(build: Callable[[], Any], stand_in: Callable,
                        strategy: Optional[Strategy]) -> Tuple[Any, Optional[ValueError]]:
    """``(build(), None)``, or ``stand_in()`` (Horovod's own object) and the
    ``ValueError`` to raise later.

    A compression strategy's tape or optimizer checks its variables across ranks only
    when it first sees them (:func:`hvdx.tensorflow.runtime.check_variables_once`). A
    ``ValueError`` of its spec's constructor or of its arguments (``op=Adasum``) is
    therefore kept, in a job of several ranks, for that check: it then fails on every
    rank with the same message, where raising at once would end this rank alone.
    Synchronization strategies check at construction, collectively, and raise there.
    """
    if strategy is None or strategy.argument == "sync":
        return build(), None  # (None: Horovod's; or a TypeError kept by the caller)
    try:
        if strategy.error is not None:
            raise strategy.error
        return build(), None
    except ValueError as error:
        error = kept_for_every_rank(error)
        return stand_in(), error


def checks_its_own_variables(strategy: Optional[Strategy]) -> bool:
    """Whether the object built for ``strategy`` checks its variables across ranks
    itself (synchronization strategies do, when they first see them); otherwise the
    entry point wraps it in Horovod's usual first-call check."""
    return strategy is not None and strategy.argument == "sync"


#: Strategy name -> ``counters(tape, variables) -> hvdx_stats``, beside the adapters
#: (the catalogue's ``tensorflow_tape_counters`` entries).
TAPE_COUNTERS: Mapping[str, Callable] = catalogue.adapters("tensorflow_tape_counters")


def tape_counters(strategy: Optional[Strategy]) -> Optional[Callable]:
    """``(tape, variables) -> hvdx_stats`` of the tapes that run ``strategy`` (for the
    step log, :func:`hvdx.step_log.watch_tensorflow`); ``None`` for Horovod's (a Keras
    optimizer carries its own ``hvdx_stats``)."""
    return None if strategy is None else TAPE_COUNTERS.get(strategy.name)


def tape(horovod: Callable, strategy: Optional[Strategy], args: GradientArguments,
         gradtape):
    """The tape that runs ``strategy``; Horovod's own (``horovod()``) for ``None``."""
    return _build(TAPE_ADAPTERS, "DistributedGradientTape", horovod, strategy, args,
                  gradtape)


def keras(horovod: Callable, strategy: Optional[Strategy], args: GradientArguments,
          optimizer):
    """The Keras optimizer that runs ``strategy``; Horovod's (``horovod()``) for ``None``."""
    return _build(KERAS_ADAPTERS, "keras DistributedOptimizer", horovod, strategy, args,
                  optimizer)
