"""Which TensorFlow adapter runs which hvdx strategy, as the catalogue says
(:mod:`hvdx.strategies.catalogue`: each descriptor's ``tensorflow_tape`` and
``tensorflow_keras``; a new strategy changes nothing here), and the one path by which
both TensorFlow entry points resolve a strategy before its adapter runs.

The entry points (:func:`hvdx.tensorflow.DistributedGradientTape`,
:func:`hvdx.tensorflow.keras.DistributedOptimizer`) find the strategy among their
arguments (:func:`hvdx.strategy_contract.strategy_of`) and call :func:`tape` or :func:`keras`,
which

1. resolve it against the job (:class:`~hvdx.strategy_contract.Job`, with the user's ``op``,
   ``gradient_predivide_factor`` and ``backward_passes_per_step``): a strategy's job
   checks are its spec's :meth:`~hvdx.strategy_contract.Strategy.prepare`, for both frameworks.
   A synchronization strategy (DS-Sync, graphs, a registered mixer) is resolved
   collectively and raises on every rank (:func:`hvdx.tensorflow.jobs.resolve_sync`).
   A compression strategy (TopK, a registered compressor) is resolved on this rank: its
   variables, and so its cross-rank check, come with the first gradients
   (:func:`hvdx.tensorflow.runtime.check_variables_once`), so a refusal is kept for
   that check and raised then on every rank;
2. call the adapter with ``(horovod, strategy, setup, arguments, user object)``, as
   PyTorch's entry point calls its adapters with ``(optimizer, strategy, setup,
   arguments)``. ``horovod()`` builds Horovod's own tape or optimizer from the user's
   arguments: a compression strategy installs itself on that object; a synchronization
   strategy (:mod:`hvdx.tensorflow.mixing_state`) replaces it and checks its variables across
   ranks itself, when it first sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from hvdx.strategies import catalogue
from hvdx.strategy_contract import Resolved, Strategy, adapter_for, kept_for_every_rank, resolve

__all__ = ["GradientArguments", "KERAS_ADAPTERS", "TAPE_ADAPTERS", "TAPE_COUNTERS",
           "TAPE_FITS", "checks_its_own_variables", "fit_tape", "keras", "tape",
           "tape_counters"]


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
    #: A synchronization strategy's: every setting the ranks compared when it was
    #: resolved (its mixing state compares them again with the variables).
    checked_settings: Tuple = ()

    def job(self):
        """The :class:`~hvdx.strategy_contract.Job` these arguments describe."""
        from hvdx.tensorflow.jobs import job

        return job(self.compression, self.process_set, self.op,
                   self.gradient_predivide_factor, self.backward_passes_per_step)

    def aggregation(self) -> Dict[str, Any]:
        """The Keras aggregation arguments, as keywords."""
        return dict(backward_passes_per_step=self.backward_passes_per_step,
                    average_aggregated_gradients=self.average_aggregated_gradients,
                    sparse_as_dense=self.sparse_as_dense,
                    scale_local_gradients=self.scale_local_gradients)


#: Strategy name -> ``adapter(horovod, strategy, setup, arguments, user_object)``: live views
#: of the catalogue's ``tensorflow_tape`` and ``tensorflow_keras`` entries
#: (:mod:`hvdx.strategies.catalogue`; a registered compressor's included).
TAPE_ADAPTERS: Mapping[str, Callable] = catalogue.field_table("tensorflow_tape")
KERAS_ADAPTERS: Mapping[str, Callable] = catalogue.field_table("tensorflow_keras")


def _build(table: Mapping[str, Callable], what: str, horovod: Callable,
           strategy: Optional[Strategy], args: GradientArguments, user,
           stand_in: Callable, keras_settings: bool) -> Tuple[Any, Resolved]:
    """Resolve ``strategy`` (module docstring, step 1), then run its adapter.

    Returns:
        the object built, and the resolution: for a compression strategy its settings,
        and its refusal (``error``) to raise at the first gradients' cross-rank check,
        with ``stand_in()`` (Horovod's own object) built in the meantime.
    """
    if strategy is None:
        return horovod(), Resolved([])
    adapter = adapter_for(table, strategy, what)
    if strategy.argument == "sync":
        from hvdx.tensorflow.jobs import resolve_sync

        resolved = resolve_sync(strategy, args.job(), what,
                                args.aggregation() if keras_settings else None,
                                once=not keras_settings)
        args = args._replace(checked_settings=tuple(resolved.settings))
    else:
        resolved = resolve(strategy, args.job())  # not collective: a compressor's prepare
        if resolved.error is not None:
            return stand_in(), Resolved(resolved.settings, None,
                                        kept_for_every_rank(resolved.error))
    built = adapter(horovod, strategy, resolved.setup, args, user)
    from hvdx.tensorflow.join_guard import track

    track(strategy)  # hvd.join() refuses from now on (hvdx.tensorflow.join_guard)
    return built, resolved


def checks_its_own_variables(strategy: Optional[Strategy]) -> bool:
    """Whether the object built for ``strategy`` checks its variables across ranks
    itself (synchronization strategies do, when they first see them); otherwise the
    entry point wraps it in Horovod's usual first-call check."""
    return strategy is not None and strategy.argument == "sync"


#: Strategy name -> ``counters(tape, variables) -> hvdx_stats``, beside the adapters
#: (the catalogue's ``tensorflow_tape_counters`` entries).
TAPE_COUNTERS: Mapping[str, Callable] = catalogue.field_table("tensorflow_tape_counters")


def tape_counters(strategy: Optional[Strategy]) -> Optional[Callable]:
    """``(tape, variables) -> hvdx_stats`` of the tapes that run ``strategy`` (for the
    step log, :func:`hvdx.step_log.watch_tensorflow`); ``None`` for Horovod's (a Keras
    optimizer carries its own ``hvdx_stats``)."""
    return None if strategy is None else TAPE_COUNTERS.get(strategy.name)


#: Strategy name -> ``fit(spec) -> spec`` as a tape runs it (the catalogue's
#: ``tensorflow_tape_fit`` entries: ``HVDX_SYNC``'s ``Decentralized`` order).
TAPE_FITS: Mapping[str, Callable] = catalogue.field_table("tensorflow_tape_fit")


def fit_tape(strategy: Strategy) -> Strategy:
    """``strategy`` as ``DistributedGradientTape`` runs it (:data:`TAPE_FITS`), for
    :func:`hvdx.environment.choose`'s ``fit``; a spec whose constructor failed, or
    that no entry fits, as it is."""
    if strategy.error is not None or strategy.name not in TAPE_FITS:
        return strategy
    return TAPE_FITS[strategy.name](strategy)


def tape(horovod: Callable, strategy: Optional[Strategy], args: GradientArguments,
         gradtape) -> Tuple[Any, Resolved]:
    """The tape that runs ``strategy``, Horovod's own (``horovod()``) for ``None``, and
    the resolution (:func:`_build`)."""
    return _build(TAPE_ADAPTERS, "DistributedGradientTape", horovod, strategy, args,
                  gradtape, horovod, keras_settings=False)


def keras(horovod: Callable, strategy: Optional[Strategy], args: GradientArguments,
          optimizer, stand_in: Callable) -> Tuple[Any, Resolved]:
    """The Keras optimizer that runs ``strategy``, Horovod's (``horovod()``) for
    ``None``, and the resolution; ``stand_in()`` builds Horovod's optimizer for a rank
    whose arguments were refused (:func:`_build`). Keras' aggregation arguments join
    a synchronization strategy's cross-rank check: ranks that summed different numbers
    of passes would mix at different steps and wait for each other."""
    return _build(KERAS_ADAPTERS, "keras DistributedOptimizer", horovod, strategy, args,
                  optimizer, stand_in, keras_settings=True)
