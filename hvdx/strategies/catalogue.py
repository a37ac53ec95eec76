"""The catalogue of strategies: every built-in strategy listed once, and the look-ups.

Each framework's registry (:mod:`hvdx.torch.registry`, :mod:`hvdx.tensorflow.registry`),
the environment parser (:mod:`hvdx.environment`) and ``hvd.init``'s check of the
variables (:func:`hvdx.environment_variables.asks_for_dssync`) read the strategies
from here, so a new strategy is one entry in :data:`BUILT_IN` and its own modules:

1. :data:`BUILT_IN` holds the built-in descriptors, in the order messages list them;
2. :func:`register` adds a descriptor at run time: ``hvdx.register_compressor`` adds
   one per registered compressor (kind ``compression``, all sharing the adapters of
   ``user_compression``), and :func:`unregister` takes it out again;
3. the look-ups (:func:`descriptor`, :func:`of_kind`, :func:`environment_constructors`,
   :func:`adapters`) read the built-in entries, then the registered ones, each time
   they are called: a compressor registered after a registry was imported is seen.

Nothing here imports a framework (the paths are lazy: :mod:`hvdx.strategies.descriptor`).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Mapping, Optional, Tuple

from hvdx.strategies.descriptor import (KINDS, VARIABLES, BenchVariant, Constructor,
                                        PlanOption, StrategyDescriptor, load)
from hvdx.topk_presets import PRESETS

__all__ = ["BUILT_IN", "adapters", "all_descriptors", "descriptor", "environment_constructors",
           "of_kind", "register", "unregister", "variable_kind"]

# The adapters a registered compressor runs with (one pair of modules for them all).
_USER_COMPRESSION = dict(
    torch_adapter="hvdx.torch.user_compression:adapter",
    tensorflow_tape="hvdx.tensorflow.user_compression:tape_adapter",
    tensorflow_keras="hvdx.tensorflow.user_compression:keras_adapter",
    tensorflow_tape_counters="hvdx.tensorflow.user_compression:tape_counters")

#: The built-in strategies, each once.
BUILT_IN: Tuple[StrategyDescriptor, ...] = (
    StrategyDescriptor(
        name="topk", kind="compression", title="TopK",
        # The presets are bare names for topk(preset=...): topk_presets.PRESETS says
        # which there are, so a new preset needs no entry here.
        constructors=(Constructor("topk", "hvdx.compression:topk"),) + tuple(
            Constructor(p, preset=p, calls="topk") for p in PRESETS),
        torch_adapter="hvdx.torch.topk_optimizer:adapter",
        torch_fit="hvdx.torch.registry:_fit_topk",
        tensorflow_tape="hvdx.tensorflow.topk:tape_adapter",
        tensorflow_keras="hvdx.tensorflow.topk:keras_adapter",
        tensorflow_tape_counters="hvdx.tensorflow.topk:tape_counters",
        cost_model="topk",
        state_exports=("hvdx.tensorflow.topk:topk_state",),
        examples=("topk(0.01, 0.01)", "topk(preset='safe', downlink_ratio=0.05)"),
        tensorflow_exports=("hvdx.tensorflow.topk:TopKState",),
        bench=(BenchVariant("topk", "hvdx.bench.strategies:topk_strategy", default=False,
                            full=True),
               BenchVariant("topk_dgc", "hvdx.bench.strategies:topk_strategy",
                            {"preset": "fast"}, aliases=("fast",)),
               BenchVariant("topk_masked", "hvdx.bench.strategies:topk_strategy",
                            {"preset": "safe"}, aliases=("safe",))),
        soak="topk(0.01, 0.01)", plan_line="hvdx.plan:_topk_line",
        plan_options=(PlanOption("--ratio", float, "topk: uplink ratio", 0.01),
                      PlanOption("--downlink-ratio", float,
                                 "topk sharded: downlink ratio (default: --ratio)"))),
    StrategyDescriptor(
        name="user_compression", kind="compression",
        title="a registered compressor with error feedback",
        # No constructor of its own: each registered compressor is an entry of its
        # own (register()), whose name is the constructor.
        **_USER_COMPRESSION,
        state_exports=("hvdx.tensorflow.user_compression:compression_state",),
        tensorflow_exports=("hvdx.tensorflow.user_compression:CompressionState",)),
    StrategyDescriptor(
        name="dssync", kind="sync", title="DS-Sync",
        constructors=(Constructor("DSSync", "hvdx.dssync:DSSync"),),
        torch_adapter="hvdx.torch.dssync_optimizer:adapter",
        tensorflow_tape="hvdx.tensorflow.dssync:tape_adapter",
        tensorflow_keras="hvdx.tensorflow.dssync:keras_adapter",
        tensorflow_tape_counters="hvdx.tensorflow.mixing:tape_counters",
        cost_model="dssync",
        state_exports=("hvdx.tensorflow.dssync:dssync_state",),
        dynamic_process_sets=True,
        examples=("DSSync(intra_phases=4)",),
        torch_exports=("hvdx.torch.dssync_optimizer:dssync_process_sets",),
        tensorflow_exports=("hvdx.tensorflow.dssync:dssync_process_sets",),
        bench=(BenchVariant("dssync", "hvdx.bench.strategies:dssync_strategy"),
               BenchVariant("dssync_adaptive", "hvdx.bench.strategies:dssync_strategy",
                            {"adaptive": True}, default=False)),
        soak="DSSync('shuffle', group_size=2, seed=0)", plan_line="hvdx.plan:_dssync_line",
        plan_options=(PlanOption("--intra-phases", int,
                                 "dssync: intra-rack phases per cross-rack phase", 1),
                      PlanOption("--cross-ranks", int,
                                 "dssync: ranks per rack in a cross phase (default: all)"))),
    StrategyDescriptor(
        name="decentralized", kind="sync", title="decentralized SGD",
        constructors=(Constructor("Decentralized", "hvdx.decentralized:Decentralized"),),
        torch_adapter="hvdx.torch.decentralized_optimizer:adapter",
        tensorflow_tape="hvdx.tensorflow.decentralized:tape_adapter",
        tensorflow_keras="hvdx.tensorflow.decentralized:keras_adapter",
        tensorflow_tape_counters="hvdx.tensorflow.mixing:tape_counters",
        cost_model="decentralized",
        state_exports=("hvdx.tensorflow.decentralized:decentralized_state",),
        examples=("Decentralized(topology='one-peer-exp')",),
        bench=tuple(BenchVariant(name, "hvdx.bench.strategies:decentralized_strategy", kwargs,
                                 default=not kwargs) for name, kwargs in (
            ("decentralized", {}), ("decentralized_static", {"topology": "static-exp"}),
            ("decentralized_cta", {"order": "combine_then_adapt"}))),
        soak="Decentralized('one-peer-exp')", plan_line="hvdx.plan:_decentralized_line",
        plan_options=(PlanOption("--mix-every", int, "decentralized: mix every N steps, "
                                 "local steps between", 1),)),
    StrategyDescriptor(
        name="stanza", kind="trainer", title="Stanza",
        torch_trainer="hvdx.torch.stanza:Stanza",
        tensorflow_trainer="hvdx.tensorflow.stanza:Stanza",
        cost_model="stanza",
        bench=tuple(BenchVariant(name, "hvdx.bench.strategies:stanza_strategy", kwargs,
                                 default=name == "stanza") for name, kwargs in (
            ("stanza", {"fc_workers": 1}), ("stanza_f2", {"fc_workers": 2}),
            ("stanza_auto", {"fc_workers": "auto"}),
            ("stanza_micro", {"fc_workers": 1, "micro_batches": 4}))),
        plan_line="hvdx.plan:_stanza_line",
        plan_options=(PlanOption("--fc-workers", int, "stanza: FC workers", 1),)),
)

#: Descriptors added by :func:`register`, by name, in the order they came.
_REGISTERED: Dict[str, StrategyDescriptor] = {}


def all_descriptors() -> Tuple[StrategyDescriptor, ...]:
    """The built-in descriptors, then the registered ones."""
    return BUILT_IN + tuple(_REGISTERED.values())


def descriptor(name: str) -> StrategyDescriptor:
    """The descriptor whose registry key is ``name``.

    Raises:
        KeyError: no strategy is called ``name``.
    """
    for d in all_descriptors():
        if d.name == name:
            return d
    raise KeyError(name)


def of_kind(kind: str, built_in_only: bool = False) -> Tuple[StrategyDescriptor, ...]:
    """The descriptors of ``kind`` (one of :data:`~hvdx.strategies.descriptor.KINDS`)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    return tuple(d for d in all_descriptors()
                 if d.kind == kind and (d.built_in or not built_in_only))


def variable_kind(variable: str) -> str:
    """The kind of strategy ``variable`` (``HVDX_COMPRESSION``, ``HVDX_SYNC``) chooses."""
    for kind, name in VARIABLES.items():
        if name == variable:
            return kind
    raise ValueError(f"{variable!r} chooses no strategy (known: {sorted(VARIABLES.values())})")


def environment_constructors(variable: str, built_in_only: bool = False
                             ) -> Dict[str, Tuple[Constructor, StrategyDescriptor]]:
    """Name -> ``(constructor, its descriptor)`` of every name ``variable`` accepts,
    presets included, in catalogue order."""
    return {c.name: (c, d) for d in of_kind(variable_kind(variable), built_in_only)
            for c in d.constructors}


def register(entry: StrategyDescriptor) -> None:
    """Add ``entry`` to the catalogue (``hvdx.register_compressor`` does, per compressor).

    Registering an equal descriptor again does nothing.

    Raises:
        ValueError: ``entry`` is marked built-in, or its name or a constructor's name is
            already another strategy's (a name must mean one thing in every look-up).
    """
    if entry.built_in:
        raise ValueError(f"strategy {entry.name!r}: a registered descriptor has "
                         "built_in=False")
    if _REGISTERED.get(entry.name) == entry:
        return
    taken = {d.name for d in all_descriptors()}
    if entry.name in taken:
        raise ValueError(f"strategy {entry.name!r} is already in the catalogue")
    if entry.variable is not None:
        clash = set(environment_constructors(entry.variable)) & \
            {c.name for c in entry.constructors}
        if clash:
            raise ValueError(f"strategy {entry.name!r}: {entry.variable} already accepts "
                             f"{sorted(clash)}")
    _REGISTERED[entry.name] = entry


def unregister(name: str) -> None:
    """Take the registered strategy ``name`` out again (nothing if it is not there).

    Raises:
        ValueError: ``name`` is a built-in strategy.
    """
    if any(d.name == name for d in BUILT_IN):
        raise ValueError(f"strategy {name!r} is built in; it cannot be taken out")
    _REGISTERED.pop(name, None)


class _Adapters(Mapping):
    """Name -> the object one descriptor field's lazy path names, for the descriptors
    of the given kinds that have that field: a read-only view of the catalogue.

    Looking a name up imports its module (as the registries' own functions used to,
    inside their bodies); iterating over the names imports nothing. The view reads the
    catalogue at every call, so a registered compressor appears in it.
    """

    def __init__(self, field: str, kinds: Tuple[str, ...]):
        self._field = field
        self._kinds = kinds

    def _paths(self) -> Dict[str, str]:
        return {d.name: getattr(d, self._field) for d in all_descriptors()
                if d.kind in self._kinds and getattr(d, self._field) is not None}

    def __getitem__(self, name: str) -> Callable:
        return load(self._paths()[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __len__(self) -> int:
        return len(self._paths())

    def __repr__(self) -> str:
        return f"<catalogue view {self._field}: {sorted(self._paths())}>"


def adapters(field: str, kinds: Optional[Tuple[str, ...]] = None) -> Mapping:
    """A live view name -> object of the descriptor field ``field``
    (``"torch_adapter"``, ``"tensorflow_tape"``, ...), for strategies of ``kinds``
    (default: those an entry point's ``compression=`` or ``sync=`` carries)."""
    if field not in StrategyDescriptor.__dataclass_fields__:
        raise ValueError(f"{field!r} is no field of StrategyDescriptor")
    return _Adapters(field, tuple(VARIABLES) if kinds is None else tuple(kinds))
