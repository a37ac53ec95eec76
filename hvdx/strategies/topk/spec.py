"""Framework-neutral compression specs that need hvdx's own synchronization.

Horovod's ``Compressor`` interface (``compress`` / ``decompress`` around an allreduce)
cannot carry TopK: an allreduce sums the compressed tensors element-wise, while TopK
pairs differ per rank (Horovod issue #3312). A :class:`TopKCompression` is therefore not a
Horovod compressor but a description that the framework adapters recognise and turn into
hvdx's own optimizer (``hvdx.torch.Compression.topk``).

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203; the math is in :mod:`hvdx.strategies.topk.core_bidirectional`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import ClassVar, FrozenSet, List, Optional

from hvdx.core.validation import check_integer
from hvdx.keywords import bind, unexpected_keyword
from hvdx.strategies.topk.core_bidirectional import MODES, TopKConfig, canonical_topk_method
from hvdx.strategies.topk.core_selection import DEFAULT_SAMPLE_SIZE
from hvdx.strategies.topk.presets import preset_arguments
from hvdx.strategy_contract import CompressionStrategy, Job, kept_for_every_rank, validating

__all__ = ["MODES_AUTO", "RENAMED", "SELECTIONS", "SMALL_TENSORS", "SMALL_TENSORS_ALIASES",
           "TopKCompression", "topk"]

#: Accepted ``mode`` values: ``"auto"`` is sharded above 2 ranks, gathered otherwise.
MODES_AUTO = ("auto",) + MODES

#: Tensors with fewer entries go dense through Horovod's allreduce.
DEFAULT_MIN_SIZE = 1024

#: Accepted ``selection`` values: each tensor its own ``k``, or one ``k`` over all.
SELECTIONS = ("layerwise", "global")

#: Accepted ``small_tensors`` values: how the tensors below ``min_size`` are averaged in a
#: compressed step: by Horovod's allreduce, or in hvdx's TopK step itself.
SMALL_TENSORS = ("horovod_allreduce", "in_topk_step")
#: Old ``small_tensors`` values, which named who averages (still accepted).
SMALL_TENSORS_ALIASES = {"horovod": "horovod_allreduce", "hvdx": "in_topk_step"}

#: Old argument names of :func:`topk` -> the new ones (both accepted; old values too).
RENAMED = {"selector": "topk_method"}


@dataclass(frozen=True)
class TopKCompression(CompressionStrategy):
    """Bidirectional (or unidirectional) TopK with error feedback, and how to run it.

    Args:
        config: the core settings (ratios, ``topk_method``, seed).
        mode: ``"gathered"`` (one allgather of every rank's pairs; every rank computes the
            downlink), ``"sharded"`` (alltoall to shard owners, allgather of the selected
            shards) or ``"auto"`` (sharded when more than 2 ranks).
        min_size: tensors with fewer entries are averaged densely (see ``small_tensors``).
        small_tensors: how the tensors below ``min_size`` are averaged in a compressed
            step: ``"horovod_allreduce"`` (Horovod's allreduce, the default) or
            ``"in_topk_step"`` (in hvdx's TopK step: one MPI allreduce of their float32
            concatenation, on hvdx's communicator, overlapped with the sparse exchange).
            The old values ``"horovod"`` and ``"hvdx"`` are stored as these. With
            ``"in_topk_step"`` Horovod carries nothing during a compressed step, so its
            background loop, which still meets the other ranks every
            ``HOROVOD_CYCLE_TIME``, can run on a long cycle (e.g. 50 ms) and give its CPU
            to training. Warm-up, autotune and dense-for-good steps, and sparse
            gradients, stay with Horovod.
        warmup_steps: the first ``warmup_steps`` steps are dense for every tensor.
        autotune_steps: measure before compressing: for this many steps after
            ``warmup_steps``, training stays dense (Horovod's allreduce) and each step
            also runs the TopK exchange on the same gradients as a dry run (results and
            residuals thrown away); both are timed, and if TopK was not faster on the
            slowest rank the run stays dense for good. Where the network does not hurt
            (shared memory, a fast fabric) TopK's selection costs more than it saves;
            this keeps such a run at Horovod's speed. 0 (the default): always compress.
        sparsity_warmup_steps: DGC's sparsity warm-up: over the first
            ``sparsity_warmup_steps`` compressed steps the ratios decay geometrically
            from 0.25 to ``ratio`` and ``downlink_ratio``
            (:mod:`hvdx.strategies.topk.core_sparsity_warmup`).
        error_feedback: keep the worker and server residuals (the default). ``False`` runs
            plain TopK: what a selection drops is lost, and no residual is stored.
        selection: ``"layerwise"`` (each compressed tensor keeps its ``ratio`` of its own
            entries) or ``"global"`` (the compressed tensors are treated as one vector,
            concatenated in the fixed parameter order, and ``ratio`` of all their entries
            is kept wherever the largest are: a layer with small gradients may send
            nothing in a step, one with large gradients more than its share).
        momentum_correction: Deep Gradient Compression's momentum correction and
            factor masking (Lin, Han, Mao, Wang & Dally, ICLR 2018, arXiv 1712.01887):
            each rank accumulates its own momentum velocity and compresses that instead
            of the gradient, and zeroes the velocity where it was sent; the wrapped
            ``torch.optim.SGD`` then steps without momentum. Plain momentum applied
            after a sparse aggregate keeps pushing stale, delayed directions; this keeps
            momentum local. PyTorch, SGD without Nesterov or dampening only.
        preset: the preset the spec was built from (``topk(preset=...)``), or ``None``.
        from_preset: the arguments whose value is the preset's, not the caller's: a
            preset's ``momentum_correction`` yields where it does not apply
            (:func:`hvdx.strategies.topk.presets.for_optimizer`), the caller's does not. Neither
            is compared: ``topk(preset="fast")`` equals the same arguments given one by
            one, and :meth:`describe` shows what runs.
    """

    name: ClassVar[str] = "topk"
    argument: ClassVar[str] = "compression"
    title: ClassVar[str] = "TopK compression"
    predivides: ClassVar[bool] = True

    config: TopKConfig
    mode: str = "auto"
    min_size: int = DEFAULT_MIN_SIZE
    small_tensors: str = "horovod_allreduce"
    warmup_steps: int = 0
    error_feedback: bool = True
    selection: str = "layerwise"
    momentum_correction: bool = False
    sparsity_warmup_steps: int = 0
    momentum_masking: bool = True
    autotune_steps: int = 0
    preset: Optional[str] = field(default=None, compare=False)
    from_preset: FrozenSet[str] = field(default=frozenset(), compare=False, repr=False)

    @validating
    def __post_init__(self):
        if not isinstance(self.config, TopKConfig):
            raise TypeError(f"config={self.config!r} must be a TopKConfig")
        if self.mode not in MODES_AUTO:
            raise ValueError(f"mode={self.mode!r} must be one of {MODES_AUTO}")
        for name in ("min_size", "warmup_steps", "sparsity_warmup_steps", "autotune_steps"):
            # A numpy integer is kept as an int: equality and describe() compare it.
            object.__setattr__(self, name,
                               check_integer(name, getattr(self, name), 0, at_least=">="))
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback={self.error_feedback!r} must be True or False")
        if not isinstance(self.momentum_correction, bool):
            raise ValueError(f"momentum_correction={self.momentum_correction!r} must be "
                             "True or False")
        if not isinstance(self.momentum_masking, bool):
            raise ValueError(f"momentum_masking={self.momentum_masking!r} must be True or "
                             "False")
        if not self.momentum_masking and not self.momentum_correction:
            raise ValueError("momentum_masking=False applies to momentum_correction=True "
                             "only; set momentum_correction=True or drop momentum_masking")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r} must be one of {SELECTIONS}")
        # One spelling per setting: equality, describe() and the fingerprint compare it.
        object.__setattr__(self, "small_tensors",
                           _canonical_small_tensors(self.small_tensors, "small_tensors"))

    @property
    def ratio(self) -> float:
        return self.config.ratio

    @property
    def downlink_ratio(self) -> Optional[float]:
        return self.config.downlink_ratio

    def resolve_mode(self, n_ranks: int) -> str:
        """The mode used on ``n_ranks`` ranks (``"auto"``: sharded when ``n_ranks > 2``)."""
        if self.mode != "auto":
            return self.mode
        return "sharded" if n_ranks > 2 else "gathered"

    def summary(self, title: str) -> str:
        """Rank 0's line for a spec chosen by ``HVDX_COMPRESSION``: the direction and
        every setting. ``momentum_correction=False`` is added where a preset's momentum
        correction was dropped for the optimizer (:func:`~hvdx.strategies.topk.presets.
        for_optimizer`): :meth:`describe` leaves a ``False`` out as the default (so
        that it equals the same settings given one by one), but the preset's name
        promised ``True``."""
        way = "bidirectional" if self.downlink_ratio is not None else "unidirectional"
        dropped = "momentum_correction" in getattr(self, "from_preset", ()) and \
            not self.momentum_correction
        return (f"{way} TopK, {self.describe()[len('topk '):]}"
                + (" momentum_correction=False" if dropped else ""))

    def describe(self) -> str:
        """One rank-independent line for the fingerprint and for logs."""
        if self.error is not None:
            return self.invalid_repr()
        c = self.config
        downlink = "none" if c.downlink_ratio is None else repr(c.downlink_ratio)
        return (f"topk ratio={c.ratio!r} downlink={downlink} mode={self.mode} "
                f"min_size={self.min_size} warmup_steps={self.warmup_steps} "
                f"topk_method={c.topk_method} sample_size={c.sample_size} seed={c.seed} "
                f"error_feedback={self.error_feedback} selection={self.selection}"
                + (" momentum_correction=True" if self.momentum_correction else "")
                + ("" if self.momentum_masking else " momentum_masking=False")
                + (f" sparsity_warmup_steps={self.sparsity_warmup_steps}"
                   if self.sparsity_warmup_steps else "")
                + (f" autotune_steps={self.autotune_steps}" if self.autotune_steps else "")
                + ("" if self.small_tensors == "horovod_allreduce"
                   else f" small_tensors={self.small_tensors}"))

    def __str__(self) -> str:
        return self.describe()

    def prepare(self, job: Job) -> None:
        """The job checks of every framework's entry points: DGC's momentum correction
        needs PyTorch's SGD (:func:`hvdx.strategies.topk.presets.for_optimizer`
        settles a preset's); ``op``, ``gradient_predivide_factor`` and
        ``backward_passes_per_step`` as :meth:`CompressionStrategy.check_reduction`."""
        if self.momentum_correction and job.framework != "torch":
            raise ValueError("momentum_correction=True is implemented for PyTorch's SGD "
                             "only; use momentum_correction=False with TensorFlow")
        self.check_reduction(job)
        return None

    def fingerprint_settings(self, job, setup) -> List:
        """Nothing beyond :meth:`describe`, which is the ``compression`` entry itself."""
        return []


def topk(*args, preset: Optional[str] = None, **kwargs) -> TopKCompression:
    """Build a :class:`TopKCompression`, validating every argument here.

    The signature is :func:`_topk`'s, plus ``preset`` and the old names of
    :data:`RENAMED` (``topk(ratio=0.01, downlink_ratio=None, *, preset=None,
    mode="auto", ..., selector=None)``).

    Args:
        ratio: uplink fraction kept per tensor, in (0, 1].
        downlink_ratio: downlink fraction in (0, 1]; ``None`` for unidirectional TopK.
        preset: ``"fast"`` or ``"safe"``, the benchmark's tuned TopKs
            (:mod:`hvdx.strategies.topk.presets`): ``"fast"`` is the fastest to a target accuracy
            over a slow uplink (1% up and down, DGC momentum correction without
            masking); ``"safe"`` stays stable late in a run (a downlink twice as dense,
            with DGC's masking). Both average the small tensors in the TopK step, so
            launch them with ``HOROVOD_CYCLE_TIME=50`` (Horovod's background loop has
            nothing to carry during a step). The other arguments given with a preset
            override its values (``momentum_correction=False`` drops the preset's
            masking setting with it). A preset's momentum correction applies to
            ``torch.optim.SGD`` with momentum, without Nesterov or dampening; with any
            other optimizer (and in TensorFlow) the preset runs without it, and rank 0
            says so once (:func:`hvdx.strategies.topk.presets.for_optimizer`). ``None``: the
            arguments alone.
        mode: ``"auto"``, ``"gathered"`` or ``"sharded"``.
        min_size: tensors with fewer entries go dense.
        small_tensors: ``"horovod_allreduce"`` (Horovod's allreduce averages the tensors
            below ``min_size``) or ``"in_topk_step"`` (hvdx averages them in the TopK
            step itself, and Horovod carries nothing); the old values ``"horovod"`` and
            ``"hvdx"`` mean the same.
        warmup_steps: dense steps before TopK starts.
        topk_method: how each top ``k`` is found: ``"exact"``, or
            ``"sampled_threshold"`` (DGC's threshold estimated from a sample, then the
            exact top ``k`` of the entries above it: faster).
        sample_size: the most entries the sampled threshold looks at.
        seed: seeds the sampled threshold, identically on every rank.
        error_feedback: ``False`` for plain TopK without worker or server residuals.
        selection: ``"layerwise"`` (per tensor) or ``"global"`` (one ``k`` over all
            compressed tensors).
        momentum_correction: DGC's local momentum with factor masking (PyTorch SGD);
            given, it is kept as given (``True`` refuses any other optimizer).
        sparsity_warmup_steps: compressed steps over which the ratios decay from 0.25
            to ``ratio`` / ``downlink_ratio`` (DGC's warm-up; 0: none).
        momentum_masking: DGC's momentum factor masking (with ``momentum_correction``).
        autotune_steps: dense steps that also time a dry TopK exchange; TopK runs after
            them only if it was faster (0: always compress).
        selector: the old name of ``topk_method`` (``"threshold"``: its old value of
            ``"sampled_threshold"``); giving both is refused unless they agree.

    Raises:
        ValueError: an argument is out of range, named with its value (``ratio=2.0``,
            ``preset='fastest'``), or an old name and its new one disagree, naming
            both; in a job of several ranks, raised by the optimizer or tape that takes
            the spec, on every rank (:func:`hvdx.strategy_contract.validating`).
        TypeError: an argument ``topk`` does not take, at once (as any Python call),
            naming the closest keyword it takes (``ration``: ``ratio``).
    """
    # Which arguments the caller gave cannot be read off their values (a default given
    # on purpose overrides the preset too), hence *args and **kwargs here.
    unknown = unexpected_keyword("topk", topk.__signature__, kwargs)  # preset included
    if unknown is not None:
        raise unknown
    given = bind("topk", _TOPK_SIGNATURE, args, kwargs).arguments
    from_preset = frozenset()
    try:
        given = _new_names(given)
        if preset is not None:
            given, from_preset = preset_arguments(preset, given)
    except ValueError as error:
        return _invalid(kept_for_every_rank(error))
    spec = _topk(**given)
    if preset is not None and spec.error is None:
        object.__setattr__(spec, "preset", preset)
        object.__setattr__(spec, "from_preset", from_preset)
    return spec


def _topk(ratio: float = 0.01, downlink_ratio: Optional[float] = None, *,
          mode: str = "auto", min_size: int = DEFAULT_MIN_SIZE,
          small_tensors: str = "horovod_allreduce", warmup_steps: int = 0,
          topk_method: str = "exact", sample_size: int = DEFAULT_SAMPLE_SIZE,
          seed: int = 0, error_feedback: bool = True,
          selection: str = "layerwise",
          momentum_correction: bool = False,
          sparsity_warmup_steps: int = 0,
          momentum_masking: bool = True,
          autotune_steps: int = 0) -> TopKCompression:
    """:func:`topk` without a preset (its arguments are documented there)."""
    try:
        config = TopKConfig(ratio=ratio, downlink_ratio=downlink_ratio,
                            topk_method=topk_method, sample_size=sample_size, seed=seed)
    except ValueError as error:
        return _invalid(kept_for_every_rank(error))
    return TopKCompression(config, mode=mode, min_size=min_size,
                           small_tensors=small_tensors, warmup_steps=warmup_steps,
                           error_feedback=error_feedback, selection=selection,
                           momentum_correction=momentum_correction,
                           sparsity_warmup_steps=sparsity_warmup_steps,
                           momentum_masking=momentum_masking,
                           autotune_steps=autotune_steps)


def _invalid(error: Exception) -> TopKCompression:
    """A spec that carries ``error`` for the entry point (its settings are never used)."""
    invalid = TopKCompression(TopKConfig(ratio=1.0))  # a placeholder
    object.__setattr__(invalid, "error", error)
    return invalid


def _new_names(given: dict) -> dict:
    """``given`` (argument -> value, as the caller gave them) with each old name of
    :data:`RENAMED` replaced by its new one.

    Raises:
        ValueError: an old name's value is not accepted (naming the old name), or an
            old name and its new one are both given and mean different settings
            (naming both).
    """
    given = dict(given)
    for old, new in RENAMED.items():
        value = given.pop(old, None)
        if value is None:  # not given (its default)
            continue
        canonical = _CANONICAL[new](value, old)
        if new in given and _CANONICAL[new](given[new], new) != canonical:
            raise ValueError(f"{old}={value!r} and {new}={given[new]!r} disagree: {old} "
                             f"is the old name of {new}; give {new} only")
        given.setdefault(new, value)
    return given


def _canonical_small_tensors(value: object, argument: str = "small_tensors") -> str:
    """``value`` as one of :data:`SMALL_TENSORS` (old values mapped), else
    ``ValueError`` naming ``argument`` and ``value``."""
    value = SMALL_TENSORS_ALIASES.get(value, value) if isinstance(value, str) else value
    if value not in SMALL_TENSORS:
        raise ValueError(f"{argument}={value!r} must be one of {SMALL_TENSORS}")
    return value


#: The canonical form of each renamed argument's value (new name -> function).
_CANONICAL = {"topk_method": canonical_topk_method}


def _with_old_names(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with each old name of :data:`RENAMED` appended as a keyword-only
    parameter defaulting to ``None``."""
    old = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation="Optional[str]") for name in RENAMED]
    return signature.replace(parameters=list(signature.parameters.values()) + old)


_TOPK_SIGNATURE = _with_old_names(inspect.signature(_topk))


def _with_preset(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with ``preset=None`` as the first keyword-only parameter."""
    parameters = list(signature.parameters.values())
    first = next(i for i, p in enumerate(parameters) if p.kind is p.KEYWORD_ONLY)
    preset = inspect.Parameter("preset", inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation="Optional[str]")
    return signature.replace(parameters=parameters[:first] + [preset] + parameters[first:])


# help(topk) and IDEs show the real arguments, not *args and **kwargs.
topk.__signature__ = _with_preset(_TOPK_SIGNATURE)
#: ``compression=hvd.Compression.topk`` (not called) is refused by this mark
#: (:func:`hvdx.strategy_contract.strategy_of`): Horovod's compressors are passed uncalled.
topk.hvdx_builds = "compression"
