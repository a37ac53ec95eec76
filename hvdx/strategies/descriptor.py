"""What hvdx knows about one strategy, in one frozen record: :class:`StrategyDescriptor`.

A strategy's knowledge used to be spread over tables keyed by its name (each
framework's registry of adapters, the environment's constructors and names, the
checkpoint exports). A descriptor holds all of it; the catalogue
(:mod:`hvdx.strategies.catalogue`) lists the descriptors once, and those tables are
views of it.

Everything that lives in a framework is named by a *lazy path*, ``"module:attribute"``
(``"hvdx.torch.topk_optimizer:adapter"``), and imported only when it is used
(:func:`load`):

1. the catalogue is imported by framework-neutral code (the environment parser, which
   ``hvd.init`` runs before any framework module is loaded), so it must import no
   framework itself;
2. a path is a string, not an ``import`` statement, so it adds no edge to hvdx's import
   graph (tests/unit/test_no_import_cycles.py): a framework registry may name its own
   adapters without importing back into itself;
3. a path that names nothing is an error of the catalogue, found by the unit test that
   loads every path (tests/unit/test_strategy_catalogue.py), not by a job.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

__all__ = ["Constructor", "KINDS", "StrategyDescriptor", "VARIABLES", "Builder", "load"]

#: ``"compression"``: carried by ``compression=`` and ``HVDX_COMPRESSION``;
#: ``"sync"``: by ``sync=`` and ``HVDX_SYNC``; ``"trainer"``: built instead of the
#: optimizer (it runs each step itself), chosen by no variable.
KINDS = ("compression", "sync", "trainer")

#: The variable that chooses a strategy of each kind at launch (a trainer has none: it
#: replaces ``DistributedOptimizer``, which a variable cannot do to a script).
VARIABLES = {"compression": "HVDX_COMPRESSION", "sync": "HVDX_SYNC"}

#: A builder of specs: a callable, or the lazy path of one.
Builder = Union[str, Callable[..., Any]]


def load(path: Builder) -> Any:
    """The object a lazy path ``"module:attribute"`` names (a callable is returned as
    it is).

    1. import ``module`` (Python caches it: the second load costs a dictionary look-up);
    2. follow the dotted ``attribute`` (``"Compression.topk"``) from it.

    Raises:
        ImportError: the module (or its framework) cannot be imported.
        AttributeError: the module has no such attribute.
        ValueError: ``path`` is a string without ``:``.
    """
    if not isinstance(path, str):
        return path
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"{path!r} is not a lazy path 'module:attribute'")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class Constructor:
    """A name that ``HVDX_COMPRESSION`` or ``HVDX_SYNC`` accepts, and what it builds.

    Attributes:
        name: the name as written in the variable (``"DSSync"``, ``"topk"``, ``"fast"``).
        build: the callable that builds the spec, or its lazy path; ``None`` for a
            preset (it builds through :attr:`calls`).
        preset: for a preset, the value it stands for: the bare name ``fast`` means
            ``topk(preset="fast")``. A preset takes no arguments (they go to the
            constructor it calls: ``topk(preset='fast', ratio=0.02)``).
        calls: for a preset, the name of the constructor it calls.
    """

    name: str
    build: Optional[Builder] = None
    preset: Optional[str] = None
    calls: Optional[str] = None

    def __post_init__(self):
        # A constructor either builds or is a preset of one that does; both or neither
        # would leave the parser guessing.
        if (self.build is None) == (self.preset is None) or \
                (self.preset is None) != (self.calls is None):
            raise ValueError(f"constructor {self.name!r}: give build=, or preset= with "
                             "calls=")


@dataclass(frozen=True)
class StrategyDescriptor:
    """One strategy, as every part of hvdx that names strategies needs it.

    Attributes:
        name: the registry key: the spec's ``name`` (``"topk"``, ``"dssync"``), what the
            framework registries and the fingerprint call it.
        kind: one of :data:`KINDS`.
        title: the human name in messages (``"DS-Sync"``).
        constructors: the names its variable (:data:`VARIABLES` of its kind) accepts,
            presets included, in the order messages list them.
        torch_adapter: lazy path of ``adapter(optimizer, strategy, plan, arguments)``
            (:mod:`hvdx.torch.registry`), or ``None``.
        torch_fit: lazy path of ``fit(spec, optimizer) -> spec``, which settles what
            depends on the optimizer before the cross-rank check, or ``None``.
        tensorflow_tape, tensorflow_keras: lazy paths of
            ``adapter(horovod, strategy, arguments, user_object)`` for
            ``DistributedGradientTape`` and Keras' ``DistributedOptimizer``
            (:mod:`hvdx.tensorflow.registry`), or ``None``.
        tensorflow_tape_counters: lazy path of ``counters(tape, variables)`` for the
            step log, or ``None``.
        torch_trainer, tensorflow_trainer: for a trainer, the lazy paths of its class.
        cost_model: its key among the cost model's layouts
            (:data:`hvdx.core.cost.layouts.STRATEGIES`), or ``None`` if not priced.
        state_exports: lazy paths of the public functions that give its state for a
            checkpoint (``hvdx.tensorflow.topk_state``), where there are such.
        dynamic_process_sets: whether it registers Horovod process sets while it runs,
            so that ``hvd.init`` must start Horovod in dynamic-set mode when a variable
            asks for it (DS-Sync's groups).
        built_in: ``False`` for a compressor a user registered
            (``hvdx.register_compressor``).
    """

    name: str
    kind: str
    title: str
    constructors: Tuple[Constructor, ...] = ()
    torch_adapter: Optional[str] = None
    torch_fit: Optional[str] = None
    tensorflow_tape: Optional[str] = None
    tensorflow_keras: Optional[str] = None
    tensorflow_tape_counters: Optional[str] = None
    torch_trainer: Optional[str] = None
    tensorflow_trainer: Optional[str] = None
    cost_model: Optional[str] = None
    state_exports: Tuple[str, ...] = ()
    dynamic_process_sets: bool = False
    built_in: bool = True

    def __post_init__(self):
        # Checked here, once, so that a malformed entry fails at import (or at
        # register()), not in the middle of a job.
        if self.kind not in KINDS:
            raise ValueError(f"strategy {self.name!r}: kind={self.kind!r} must be one of "
                             f"{KINDS}")
        if self.constructors and self.kind not in VARIABLES:
            raise ValueError(f"strategy {self.name!r}: a {self.kind} is chosen by no "
                             "variable, so it has no constructors")
        names = [c.name for c in self.constructors]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy {self.name!r}: a constructor name twice: {names}")
        for c in self.constructors:
            if c.calls is not None and c.calls not in names:
                raise ValueError(f"strategy {self.name!r}: preset {c.name!r} calls "
                                 f"{c.calls!r}, which it does not have")

    @property
    def variable(self) -> Optional[str]:
        """The variable that chooses it (``None`` for a trainer)."""
        return VARIABLES.get(self.kind)

    def lazy_paths(self) -> Tuple[Tuple[str, str], ...]:
        """``(field, path)`` of every lazy path it holds, constructors' included."""
        fields = ("torch_adapter", "torch_fit", "tensorflow_tape", "tensorflow_keras",
                  "tensorflow_tape_counters", "torch_trainer", "tensorflow_trainer")
        paths = [(f, getattr(self, f)) for f in fields if getattr(self, f) is not None]
        paths += [(f"constructor {c.name}", c.build) for c in self.constructors
                  if isinstance(c.build, str)]
        paths += [("state_exports", p) for p in self.state_exports]
        return tuple(paths)
