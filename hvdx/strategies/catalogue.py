"""The catalogue of strategies: every built-in strategy listed once, and the look-ups.

Each framework's registry (:mod:`hvdx.torch.registry`, :mod:`hvdx.tensorflow.registry`),
the environment parser (:mod:`hvdx.environment`), ``hvd.init``'s check of the
variables (:func:`hvdx.environment_variables.asks_for_dssync`) and the cost model's
table of layouts (:mod:`hvdx.core.cost.layouts`) read the strategies from here, so a
new strategy is a folder of its own, ``hvdx/strategies/<name>/`` (its modules, its
cost layout ``core_cost.py`` and its ``descriptor.py``), and one line in
:data:`BUILT_IN`:

1. :data:`BUILT_IN` holds the built-in descriptors, in the order messages list them
   (each strategy's own in its folder's ``descriptor.py``);
2. :func:`register` adds a descriptor at run time: ``hvdx.register_compressor`` adds
   one per registered compressor (kind ``compression``, all sharing the adapters of
   ``user_compression``), and :func:`unregister` takes it out again;
3. the look-ups (:func:`descriptor`, :func:`of_kind`, :func:`environment_constructors`,
   :func:`field_table`) read the built-in entries, then the registered ones, each time
   they are called: a compressor registered after a registry was imported is seen.

Nothing here imports a framework (the paths are lazy: :mod:`hvdx.strategies.descriptor`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import (Any, Callable, Dict, Iterator, List, Mapping, MutableMapping,
                    Optional, Tuple)

from hvdx.strategies.decentralized.descriptor import DECENTRALIZED
from hvdx.strategies.descriptor import (KINDS, VARIABLES, Builder, Constructor,
                                        StrategyDescriptor, load)
from hvdx.strategies.dssync.descriptor import DSSYNC
from hvdx.strategies.low_precision.descriptor import INT8, SIGN
from hvdx.strategies.stanza.descriptor import STANZA
from hvdx.strategies.topk.descriptor import TOPK

__all__ = ["BUILT_IN", "ClassRegistry", "LazyView", "RegisteredClassSpec", "field_table",
           "all_descriptors", "descriptor", "environment_constructors", "exports",
           "module_exports", "of_kind", "qualified", "register", "registered_entry",
           "settings_of", "synchronizer_of", "unregister", "variable_kind"]


#: The built-in strategies, each once (each from its folder's descriptor.py).
BUILT_IN: Tuple[StrategyDescriptor, ...] = (
    TOPK,
    INT8, SIGN,
    StrategyDescriptor(
        name="user_compression", kind="compression",
        title="a registered compressor with error feedback",
        # No constructor of its own: each registered compressor is an entry of its
        # own (register()), whose name is the constructor. Its adapters are the
        # shared compression drivers', as every compression strategy's.
        synchronizer="hvdx.mpi.user_compression_exchange:UserCompressionSynchronizer",
        state_exports=("hvdx.tensorflow.compression_residuals:STATE_GETTERS.compression_state",),
        tensorflow_exports=("hvdx.tensorflow.compression_residuals:CompressionState",)),
    DSSYNC,
    DECENTRALIZED,
    StrategyDescriptor(
        name="user_mixer", kind="sync", title="a registered mixer",
        # No constructor of its own (each registered mixer is an entry named by its
        # user); it carries what hvdx.tensorflow exports for them all.
        # Its adapters are the shared mixing drivers', as every synchronization
        # strategy's (hvdx.strategies.descriptor.MIXING_DRIVERS).
        state_exports=("hvdx.tensorflow.mixing_state:STATE_GETTERS.mixer_state",),
        tensorflow_exports=("hvdx.tensorflow.mixing_state:MixingState",)),
    STANZA,
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


def exports(framework: str) -> Dict[str, str]:
    """Name -> lazy path of every public name the built-in strategies give
    ``framework``'s module (``"hvdx"``, ``"torch"``, ``"tensorflow"``:
    :meth:`~hvdx.strategies.descriptor.StrategyDescriptor.exports`), in catalogue order."""
    return dict(e for d in BUILT_IN for e in d.exports(framework))


def module_exports(module: str, framework: str
                   ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` (PEP 562) of ``module``
    (``"hvdx.torch"``), which serve :func:`exports` of ``framework``.

    A name the module writes out is found without them (grep and IDEs find it there);
    any other export is loaded by its lazy path when first asked for, so a new
    strategy's names need no edit in the module. The catalogue is read at each call.
    """

    def __getattr__(name: str) -> Any:
        path = exports(framework).get(name)
        if path is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return load(path)

    def __dir__() -> List[str]:
        return sorted(set(vars(sys.modules[module])) | set(exports(framework)))

    return __getattr__, __dir__


def synchronizer_of(spec) -> type:
    """The synchronizer class of a compression spec's entry (its ``synchronizer``), which
    the shared compression drivers run (:mod:`hvdx.core.compression_protocol`)."""
    return load(descriptor(spec.name).synchronizer)


def registered_entry(shared: str, name: str, title: str,
                     build: Builder) -> StrategyDescriptor:
    """The entry of a class a user registered as ``name`` (``hvdx.register_compressor``,
    ``hvdx.register_mixer``): its constructor, the variable's name for it, is ``build``;
    its adapters and state exports are those of the built-in entry ``shared``
    (``user_compression``, ``user_mixer``), which carries the exports for them all."""
    return dataclasses.replace(descriptor(shared), name=name, title=title,
                               constructors=(Constructor(name, build),), built_in=False,
                               tensorflow_exports=())


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


class LazyView(Mapping):
    """Name -> the object a lazy path names, for the paths ``paths()`` gives: a
    read-only view of the catalogue (:func:`field_table`; the cost model's layouts,
    :data:`hvdx.core.cost.layouts.STRATEGIES`).

    Looking a name up imports its module (as the registries' own functions used to,
    inside their bodies); iterating over the names imports nothing. The view calls
    ``paths`` at every call, so a registered compressor appears in it.
    """

    def __init__(self, paths: Callable[[], Mapping[str, Builder]], what: str):
        self._paths = paths
        self._what = what

    def __getitem__(self, name: str) -> Callable:
        return load(self._paths()[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __len__(self) -> int:
        return len(self._paths())

    def __repr__(self) -> str:
        return f"<{self._what}: {sorted(self._paths())}>"


def field_table(field: str, kinds: Optional[Tuple[str, ...]] = None) -> Mapping:
    """A live view name -> object of the descriptor field ``field``
    (``"torch_adapter"``, ``"tensorflow_tape"``, ...), for strategies of ``kinds``
    (default: those an entry point's ``compression=`` or ``sync=`` carries)."""
    if field not in StrategyDescriptor.__dataclass_fields__:
        raise ValueError(f"{field!r} is no field of StrategyDescriptor")
    kinds = tuple(VARIABLES) if kinds is None else tuple(kinds)

    def paths() -> Dict[str, str]:
        return {d.name: getattr(d, field) for d in all_descriptors()
                if d.kind in kinds and getattr(d, field) is not None}

    return LazyView(paths, f"catalogue view {field}")


class ClassRegistry(MutableMapping):
    """Registered name -> the user's class (a compressor, a mixer), kept in step with
    the catalogue: each name is also a catalogue entry, ``descriptor_of(name)``, so the
    environment's names and the registries' views see it, and taking a name out here
    takes it out there (tests restore a registry by clearing and refilling it).
    ``hvdx.register_compressor`` and ``hvdx.register_mixer`` each keep one."""

    def __init__(self, descriptor_of: Callable[[str], StrategyDescriptor]):
        self._descriptor_of = descriptor_of
        self._classes: Dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        return self._classes[name]

    def __setitem__(self, name: str, cls: type) -> None:
        if self._classes.get(name) is cls:
            return
        unregister(name)  # another class under this name (the register functions
        self._classes[name] = cls  # refuse that; a test may do it directly)
        register(self._descriptor_of(name))

    def __delitem__(self, name: str) -> None:
        del self._classes[name]
        unregister(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)


def qualified(cls: type) -> str:
    """``module.QualifiedName`` of a class: how the messages and the fingerprint name a
    registered compressor's or mixer's class (the same on every rank, unlike its
    ``repr``)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def settings_of(instance) -> List[tuple]:
    """A registered class's instance's ``settings()`` (a compressor's, a mixer's) as
    ``(key, value)`` pairs sorted by key, else ``ValueError``: it did not return a dict.
    """
    settings = instance.settings()
    if not isinstance(settings, dict):
        raise ValueError(f"{qualified(type(instance))}.settings() returned "
                         f"{type(settings).__name__}; return a dict")
    return sorted(settings.items(), key=lambda kv: str(kv[0]))


class RegisteredClassSpec:
    """How the spec of a class in a :class:`ClassRegistry` shows itself
    (:class:`hvdx.compression_registry.UserCompression`,
    :class:`hvdx.mixer_registry.UserMixing`), in logs and in the entry point's own
    fingerprint entry: ``call() [module.Class] settings=[...]``, or the invalid spec's
    ``repr`` (:meth:`hvdx.strategy_contract.Strategy.invalid_repr`).

    A mixin, listed before the :class:`hvdx.strategy_contract.Strategy` base: the spec gives
    ``call()`` (its name and arguments as the user wrote them), ``cls`` (the registered
    class), ``settings`` (:func:`settings_of` of its instance), and ``error`` and
    ``invalid_repr()`` from its base.
    """

    cls: type
    settings: List[tuple]

    def describe(self) -> str:
        if self.error is not None:
            return self.invalid_repr()
        return f"{self.call()} [{qualified(self.cls)}] settings={self.settings!r}"

    def __repr__(self) -> str:
        return self.describe()

    __str__ = __repr__
