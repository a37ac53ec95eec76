"""The contract every hvdx strategy implements, and how the entry points use it.

A strategy is a small, framework-neutral *spec* object that the user passes to a Horovod
entry point: ``compression=hvd.Compression.topk(...)`` or ``sync=hvdx.DSSync(...)`` /
``sync=hvdx.Decentralized(...)``. The entry points (``hvdx.torch.DistributedOptimizer``,
``hvdx.tensorflow.DistributedGradientTape``, ``hvdx.tensorflow.keras.DistributedOptimizer``)
never name a concrete strategy. They:

1. find the strategy among their arguments (:func:`strategy_of`; a wrong ``sync=``
   raises ``TypeError`` at once, before any collective, as every rank passes it);
2. resolve it against the job (:func:`resolve`): :meth:`Strategy.prepare` validates what
   depends on the job (the world size, the other arguments) and builds the run-time
   setup (a schedule, a graph); :meth:`Strategy.fingerprint_settings` lists the
   fingerprint entries.
   A ``ValueError`` there does not raise yet: it becomes a fingerprint entry. So does
   one from the spec's constructor in a job of several ranks (:func:`validating`): a
   wrong value on one rank only must fail on every rank, not end that rank alone;
3. check the fingerprint across ranks (:mod:`hvdx.mpi.consistency`), so a rank that
   failed, or resolved differently, makes every rank raise the same error instead of
   leaving the others waiting in a collective; then raise the resolution's error;
4. look the strategy up in the framework's registry (``hvdx.torch.registry``,
   ``hvdx.tensorflow.registry``), which builds its run-time object.

Strategies that average parameters (DS-Sync's groups, the exponential graphs) share one
wrapper per framework and differ only in their *mixer*, after PyTorch's
``ModelAverager`` / ``PostLocalSGDOptimizer`` split: a local optimizer step, then a mixer
that averages the parameters (and buffers) with other ranks. :class:`MixingStrategy`
holds the options that wrapper implements once: ``global_every``, the SWA merge.
"""

from __future__ import annotations

import abc
import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

import numpy as np

from hvdx.core.validation import check_integer
from hvdx.keywords import unexpected_keyword
from hvdx.strategies import catalogue

__all__ = ["CompressionStrategy", "Job", "MixingStrategy", "Resolved", "Strategy",
           "adapter_for", "global_due", "kept_for_every_rank", "resolve", "several_ranks",
           "strategy_of", "strategy_or_error", "validating"]

#: A fingerprint entry: ``(name, value)``, rendered with ``repr``.
Setting = Tuple[str, object]


@dataclass(frozen=True)
class Job:
    """What a strategy may depend on, as the entry point sees it on this rank.

    Attributes:
        size: ranks in Horovod's global set.
        rank: this rank.
        horovod: Horovod's framework module (``horovod.torch``, ``horovod.tensorflow``).
        compression: the user's ``compression=``.
        no_compression: the framework's ``Compression.none``.
        process_set: the user's ``process_set=``.
        framework: ``"torch"`` or ``"tensorflow"``.
        op: the user's ``op=``; ``None``: Horovod's default, ``Average``.
        gradient_predivide_factor: the user's ``gradient_predivide_factor=``.
        backward_passes_per_step: the user's ``backward_passes_per_step=`` (1 where the
            entry point has none: TensorFlow's tape).
    """

    size: int
    rank: int
    horovod: Any
    compression: Any
    no_compression: Any
    process_set: Any
    framework: str
    op: Any = None
    gradient_predivide_factor: float = 1.0
    backward_passes_per_step: int = 1

    @property
    def global_process_set(self):
        return self.horovod.global_process_set

    def averages(self) -> bool:
        """Whether ``op`` is Horovod's ``Average`` (``None`` counts as its default)."""
        return self.op is None or self.op == self.horovod.Average

    def op_name(self) -> str:
        """``op`` as Horovod names it (``"Adasum"``), else its ``repr``."""
        for name in _OP_NAMES:
            if getattr(self.horovod, name, _NO_OP) == self.op:
                return name
        return repr(self.op)


#: Horovod's reduction ops, by their names in ``horovod.torch`` / ``horovod.tensorflow``.
_OP_NAMES = ("Average", "Sum", "Adasum", "Min", "Max", "Product")
_NO_OP = object()


class Strategy(abc.ABC):
    """One hvdx strategy's spec: fingerprint, validation, and its run-time setup.

    Subclasses set :attr:`name` (the registry key, also the ``sync`` fingerprint entry)
    and :attr:`argument` (the entry-point argument that carries it), and validate every
    job-independent argument in their constructor (``ValueError`` naming it).
    """

    #: Registry key: ``"topk"``, ``"dssync"``, ``"decentralized"``, ...
    name: ClassVar[str] = ""
    #: ``"compression"`` or ``"sync"``.
    argument: ClassVar[str] = "sync"
    #: The constructor's ``ValueError``, kept for the entry point in a job of several
    #: ranks (:func:`validating`); ``None`` for a valid spec.
    error: Optional[ValueError] = None
    #: ``(variable, raw value)`` for a spec built from the environment
    #: (:mod:`hvdx.environment`), which the fingerprint compares too; ``None`` otherwise.
    environment: Optional[Tuple[str, str]] = None

    def invalid_repr(self) -> str:
        """What ``repr`` shows of a spec whose constructor failed (its fields may be
        missing)."""
        return f"{type(self).__name__}(<invalid: {self.error}>)"

    def prepare(self, job: Job) -> Any:
        """Validate against ``job`` and return the run-time setup (collective only where
        a subclass says so). Raises ``ValueError`` naming the argument."""
        return None

    @abc.abstractmethod
    def fingerprint_settings(self, job: Job, setup: Any) -> List[Setting]:
        """Fingerprint entries: every choice that all ranks must share."""

    def describe(self) -> str:
        """One rank-independent line for logs and the entry point's own fingerprint
        entry (``compression=`` or ``sync=``)."""
        return self.name

    def summary(self, title: str) -> str:
        """Rank 0's line for a spec chosen by a variable (:mod:`hvdx.environment`):
        ``title`` (its catalogue entry's) and every setting."""
        return f"{title}, {self!r}"


class CompressionStrategy(Strategy):
    """A strategy passed as ``compression=`` that synchronizes the gradients itself
    (TopK, a registered compressor): it averages or sums, nothing else.

    Its job checks are :meth:`prepare`'s, the same for every framework's entry points
    (``op``, ``gradient_predivide_factor``, ``backward_passes_per_step``); the adapters
    receive a job that passed them.
    """

    argument: ClassVar[str] = "compression"
    #: What the messages call the strategy: ``"TopK compression"``.
    title: ClassVar[str] = "compression"
    #: Whether ``gradient_predivide_factor`` (with ``op=Average``) is honoured.
    predivides: ClassVar[bool] = False

    def prepare(self, job: Job) -> Any:
        self.check_reduction(job)
        return None

    def check_reduction(self, job: Job) -> None:
        """``op`` must be Average or Sum, and ``gradient_predivide_factor`` 1 unless
        the strategy predivides (then with Average only); ``ValueError`` naming them."""
        if not (job.averages() or job.op == job.horovod.Sum):
            raise ValueError(f"op={job.op_name()} is not supported with {self.title}; "
                             "use op=hvd.Average or op=hvd.Sum")
        if job.gradient_predivide_factor != 1.0:
            if not self.predivides:
                raise ValueError(
                    f"gradient_predivide_factor={job.gradient_predivide_factor!r} is not "
                    f"supported with {self.title}; leave it 1.0")
            if not job.averages():
                raise ValueError("gradient_predivide_factor not supported with op != "
                                 "Average")
        if job.backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")


class MixingStrategy(Strategy):
    """A strategy that averages parameters after a local step (DS-Sync, graphs).

    The options here are implemented once, by each framework's mixing wrapper:

    Args:
        global_every: every ``global_every``-th step averages over all ranks instead of
            mixing; ``0``: never.
        swa_start: the final SWA-style merge (Izmailov et al., arXiv 1803.05407): from
            the step of this index on (0-based), every rank keeps a running average of
            its parameters after mixing, sampled every ``swa_every`` steps;
            ``synchronize_parameters(swa=True)`` then writes the mean over all ranks of
            those averages into the parameters. ``None``: no running average.
        swa_every: steps between two samples (``swa_start`` must be set).
        average_optimizer_state: also mix the optimizer's per-parameter tensors
            (momentum buffers, Adam moments).
    """

    argument: ClassVar[str] = "sync"
    #: The key of the strategy's entry in torch's ``optimizer.state_dict()``, and the
    #: attribute of its state on a TensorFlow tape or Keras optimizer.
    state_key: ClassVar[str] = "hvdx_mixer"

    def make_mixer(self, setup) -> Any:
        """The :class:`hvdx.core.mixer_protocol.Mixer` this rank runs, for the setup
        :meth:`prepare` returned (the drivers call it once per optimizer or tape
        state)."""
        raise NotImplementedError(f"{type(self).__name__}.make_mixer")

    def check_tape(self) -> None:
        """Refuse what ``DistributedGradientTape`` cannot run (it can only mix before the
        update); called on every rank after the cross-rank check."""

    def _init_mixing(self, global_every=0, swa_start=None, swa_every=1,
                     average_optimizer_state=False) -> None:
        if not isinstance(average_optimizer_state, (bool, np.bool_)):
            raise ValueError(f"average_optimizer_state={average_optimizer_state!r} must be "
                             "True or False")
        self.average_optimizer_state = bool(average_optimizer_state)
        self.global_every = check_integer("global_every", global_every, 0)
        self.swa_start = None if swa_start is None else \
            check_integer("swa_start", swa_start, 0)
        self.swa_every = check_integer("swa_every", swa_every, 1)
        if self.swa_start is None and swa_every != 1:
            raise ValueError(f"swa_every={swa_every!r} needs swa_start, the step from "
                             "which the running average is kept")

    # --- the schedule every mixing wrapper follows (decided here, once) --------------

    def global_due(self, step: int) -> bool:
        """Whether step ``step`` (0-based) averages over all ranks instead of mixing
        (``global_every``)."""
        return global_due(step, self.global_every)

    def swa_due(self, step: int) -> bool:
        """Whether the mixed parameters of step ``step`` join the SWA running mean."""
        from hvdx.core.group_averaging import swa_due

        return swa_due(step, self.swa_start, self.swa_every)

    def check_gradient_arguments(self, job: Job, what: str) -> None:
        """Parameter mixing sends no gradients and picks its own peers."""
        if job.compression is not job.no_compression:
            raise ValueError(f"compression={job.compression!r}: {what} sends no gradients "
                             "to compress; leave compression=Compression.none")
        if job.process_set is not job.global_process_set:
            raise ValueError(f"process_set: {what} chooses its own peers; leave "
                             "process_set=hvd.global_process_set")


@dataclass
class Resolved:
    """A strategy resolved on this rank: fingerprint settings, setup, or the error."""

    settings: List[Setting]
    setup: Any = None
    error: Optional[Exception] = None

    def raise_error(self) -> None:
        """Raise the resolution's error (after the fingerprint check: then every rank
        failed the same way, else the fingerprints would have differed)."""
        if self.error is not None:
            raise self.error


def resolve(strategy: Optional[Strategy], job: Job) -> Resolved:
    """Prepare ``strategy`` for ``job``; a ``ValueError`` becomes a fingerprint entry.

    A spec whose constructor failed is not prepared: its error is already an entry of
    the entry point's settings (:func:`hvdx.settings.horovod_settings`). A spec built
    from a variable (``HVDX_SYNC="DSSync('shuffle', group_size=3)"`` on two ranks)
    fails naming the variable, as its other refusals do
    (:class:`~hvdx.environment_variables.VariableError`).
    """
    if strategy is None:
        return Resolved([])
    if strategy.error is not None:
        return Resolved([], None, strategy.error)
    try:
        setup = strategy.prepare(job)
        return Resolved(list(strategy.fingerprint_settings(job, setup)), setup)
    except ValueError as error:
        if strategy.environment is not None:
            from hvdx.environment_variables import refused

            error = refused(*strategy.environment, str(error))
        return Resolved([(f"{strategy.name}.error", str(error))], None, error)


def strategy_of(compression, sync) -> Optional[Strategy]:
    """The hvdx strategy among an entry point's arguments, or ``None`` (Horovod).

    ``sync=`` wins; its strategy then refuses a ``compression=`` it cannot honour in
    :meth:`Strategy.prepare` (so on every rank, through the fingerprint).

    Raises:
        TypeError: ``sync=`` is neither ``None`` nor a synchronization strategy.
        ValueError: ``sync=`` is a Stanza trainer (it replaces ``DistributedOptimizer``
            rather than configuring it); or ``compression=`` is hvdx's spec builder itself, not called
            (``compression=hvd.Compression.topk``, as Horovod's ``Compression.fp16``
            is passed): Horovod would take the function for a compressor.
    """
    if getattr(compression, "hvdx_builds", None) == "compression":
        raise ValueError(
            f"compression={getattr(compression, '__name__', compression)}: call it: "
            "compression=hvd.Compression.topk(ratio, downlink_ratio, ...) or "
            "hvd.Compression.topk(preset='fast')")
    if sync is not None:
        if _is_stanza(sync):
            raise ValueError(
                "sync=Stanza: Stanza is a trainer, not a synchronization of "
                "DistributedOptimizer: it runs each step itself (conv workers and FC "
                "workers hold different parts of the model). Build it instead of "
                "DistributedOptimizer, on every rank: trainer = hvd.Stanza(features, head, "
                "optimizer, fc_workers=F), then loss = trainer.step(inputs, labels) each "
                f"step; or pass {' / '.join(_sync_calls())}.")
        if not isinstance(sync, Strategy) or sync.argument != "sync":
            raise TypeError(
                f"sync={sync!r} is not a synchronization strategy this hvdx release "
                f"provides; pass {' or '.join(_sync_calls())}, "
                "or sync=None for Horovod's gradient allreduce.")
        return sync
    if isinstance(compression, Strategy) and compression.argument == "compression":
        return compression
    return None


def _sync_calls() -> List[str]:
    """``sync=hvdx.DSSync(...)``, ... for the built-in synchronization strategies, as
    the catalogue lists them (their constructors are ``hvdx``'s public names)."""
    return [f"sync=hvdx.{c.name}(...)" for d in catalogue.of_kind("sync", built_in_only=True)
            for c in d.constructors if c.preset is None]


def _is_stanza(value) -> bool:
    # Stanza's trainers (hvdx.torch.Stanza, hvdx.tensorflow.Stanza), an instance or the
    # class itself, by name: importing them here would import a framework.
    cls = value if isinstance(value, type) else type(value)
    return cls.__name__ == "Stanza" and cls.__module__.startswith("hvdx.")


def strategy_or_error(compression, sync) -> Tuple[Optional[Strategy], Optional[Exception]]:
    """:func:`strategy_of`, with its ``TypeError`` or ``ValueError`` returned instead of
    raised in a job of several ranks: the entry point raises it on every rank after the
    cross-rank check (a wrong ``sync=`` on one rank only must not end that rank alone)."""
    try:
        return strategy_of(compression, sync), None
    except (TypeError, ValueError) as error:
        return None, kept_for_every_rank(error)


def adapter_for(table: Dict[str, Callable], strategy: Strategy, what: str) -> Callable:
    """``strategy``'s adapter in a framework registry ``table`` (keyed by name).

    Raises:
        TypeError: ``what`` (the entry point) has no adapter for it.
    """
    try:
        return table[strategy.name]
    except KeyError:
        raise TypeError(f"{strategy.argument}={strategy!r}: {what} has no adapter for "
                        f"strategy {strategy.name!r}") from None


def several_ranks() -> bool:
    """Whether this process is one of several MPI ranks (MPI initialised, world > 1).

    Only looks: MPI is not initialised here (a spec may be built before ``hvd.init``;
    importing ``hvdx.torch`` or ``hvdx.tensorflow`` initialises it).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    return (mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()
            and mpi.COMM_WORLD.Get_size() > 1)


def kept_for_every_rank(error: Exception) -> Exception:
    """Raise ``error`` in a job of one rank (or without MPI); return it, to be raised
    on every rank after the cross-rank check, in a job of several (:func:`validating`)."""
    if not several_ranks():
        raise error
    return error


def validating(method):
    """Decorate a spec's constructor: its ``ValueError`` names the bad argument, and a
    keyword it does not take is a ``TypeError`` naming the closest it takes
    (``DSSync() got an unexpected keyword argument 'group_sise'; did you mean
    'group_size'?``, :mod:`hvdx.keywords`).

    In a job of one rank (or without MPI) the error is raised at once, where the spec
    is built. In a job of several ranks it is kept in :attr:`Strategy.error` instead,
    and the entry point that takes the spec raises it on *every* rank after the
    cross-rank check (:mod:`hvdx.mpi.consistency`), with the same message naming the
    rank: raised here, a wrong value on one rank only would end that rank and leave
    the others waiting in their next collective (or be ended by ``MPI_Abort``,
    without the reason).
    """
    signature = inspect.signature(method)

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        # A misspelt keyword: Python's TypeError, naming the closest one it takes.
        unknown = unexpected_keyword(type(self).__name__, signature, kwargs)
        if unknown is not None:
            raise unknown
        try:
            method(self, *args, **kwargs)
        except ValueError as error:
            # (setattr on the object: frozen dataclasses too)
            object.__setattr__(self, "error", kept_for_every_rank(error))
    return checked


def global_due(step: int, every: int) -> bool:
    """Whether step ``step`` (0-based) averages over all ranks (``global_every``)."""
    return bool(every) and (step + 1) % every == 0
