"""Which TensorFlow adapter runs which hvdx strategy: the one place that names them.

The entry points (:func:`hvdx.tensorflow.DistributedGradientTape`,
:func:`hvdx.tensorflow.keras.DistributedOptimizer`) find the strategy among their
arguments (:func:`hvdx.strategy.strategy_of`) and call :func:`tape` or :func:`keras`.
Each adapter gets ``horovod()``, a function that builds Horovod's own tape or optimizer
from the user's arguments: a compression strategy (TopK) installs itself on that object;
a synchronization strategy (DS-Sync, graphs: :mod:`hvdx.tensorflow.mixing`) replaces it and checks its variables across
ranks itself, when it first sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

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


def _topk_tape(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.topk import install_on_tape

    return install_on_tape(horovod(), strategy, args.op, args.gradient_predivide_factor,
                           args.process_set)


def _topk_keras(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.topk import check_topk_arguments, install_on_keras_optimizer

    check_topk_arguments(args.op, args.gradient_predivide_factor, strategy)  # first
    return install_on_keras_optimizer(horovod(), strategy, args.op,
                                      args.gradient_predivide_factor, args.process_set)


def _dssync_tape(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.dssync import make_dssync_tape

    return make_dssync_tape(user, strategy, args.compression, args.process_set,
                            args.non_trainable_variables, args.scale_local_gradients)


def _dssync_keras(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.dssync import make_dssync_keras_optimizer

    return make_dssync_keras_optimizer(user, strategy, args.compression, args.process_set,
                                       args.non_trainable_variables, **args.aggregation())


def _decentralized_tape(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.decentralized import make_decentralized_tape

    return make_decentralized_tape(user, strategy, args.compression, args.process_set,
                                   args.non_trainable_variables, args.scale_local_gradients)


def _decentralized_keras(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.decentralized import make_decentralized_keras_optimizer

    return make_decentralized_keras_optimizer(user, strategy, args.compression,
                                              args.process_set,
                                              args.non_trainable_variables,
                                              **args.aggregation())


def _user_compression_tape(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.user_compression import install_on_tape

    return install_on_tape(horovod(), strategy, args.op, args.gradient_predivide_factor,
                           args.process_set)


def _user_compression_keras(horovod: Callable, strategy, args: GradientArguments, user):
    from hvdx.tensorflow.user_compression import check_arguments, install_on_keras_optimizer

    check_arguments(args.op, args.gradient_predivide_factor)  # before Horovod's own checks
    return install_on_keras_optimizer(horovod(), strategy, args.op,
                                      args.gradient_predivide_factor, args.process_set)


#: Strategy name -> ``adapter(horovod, strategy, arguments, user_object)``.
TAPE_ADAPTERS: Dict[str, Callable] = {
    "topk": _topk_tape, "dssync": _dssync_tape, "decentralized": _decentralized_tape,
    "user_compression": _user_compression_tape}
KERAS_ADAPTERS: Dict[str, Callable] = {
    "topk": _topk_keras, "dssync": _dssync_keras, "decentralized": _decentralized_keras,
    "user_compression": _user_compression_keras}


def _build(table: Dict[str, Callable], what: str, horovod: Callable,
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


def _topk_counters(tape, variables):
    """TopK's counters: the state of the variables the tape reduced."""
    from hvdx.tensorflow.topk import topk_state

    local = getattr(tape, "_local_sources", ())  # Horovod keeps these out
    return topk_state([v for v in variables if v.ref() not in local]).stats


def _mixing_counters(tape, variables):
    """DS-Sync's and the graphs' counters: the state the tape mixes with."""
    return getattr(getattr(tape, "_hvdx_state", None), "hvdx_stats", None)


#: Strategy name -> ``counters(tape, variables) -> hvdx_stats``, beside the adapters.
TAPE_COUNTERS: Dict[str, Callable] = {
    "topk": _topk_counters, "dssync": _mixing_counters, "decentralized": _mixing_counters}


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
