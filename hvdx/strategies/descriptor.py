"""What hvdx knows about one strategy, in one frozen record: :class:`StrategyDescriptor`.

A strategy's knowledge used to be spread over tables keyed by its name (each
framework's registry of adapters, the environment's constructors and names, the
checkpoint exports). A descriptor holds all of it; the catalogue
(:mod:`hvdx.strategies.catalogue`) lists the descriptors once, and those tables are
views of it.

Everything that lives in a framework is named by a *lazy path*, ``"module:attribute"``
(``"hvdx.strategies.topk.core_cost:_topk"``), and imported only when it is used
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
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Tuple, Union

__all__ = ["BenchVariant", "Constructor", "KINDS", "PlanOption", "StrategyDescriptor",
           "VARIABLES", "Builder", "load"]

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
class BenchVariant:
    """One row of ``hvdx bench``'s table (:data:`hvdx.bench.strategies.STRATEGIES`).

    Attributes:
        name: the row's name in ``--strategies`` (``"fast"``).
        make: lazy path of ``make(name, **kwargs) -> hvdx.bench.strategy_row.BenchRow``:
            how the bench builds the optimizer, counts the bytes, labels the row and
            spells it for a script's variables.
        kwargs: literal keyword arguments of ``make`` (``{"preset": "fast"}``).
        default: run by a plain ``hvdx bench``.
        full: run by ``hvdx bench --full`` too, where not ``default``.
        aliases: other names ``--strategies`` accepts for it (``"topk_dgc"``).
    """

    name: str
    make: str
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)
    default: bool = True
    full: bool = False
    aliases: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanOption:
    """A flag of ``hvdx plan``'s "strategy options", handed to the cost model by its
    dest (``--downlink-ratio`` -> ``downlink_ratio``) when given or defaulted."""

    flag: str
    type: Callable
    help: str
    default: Any = None

    @property
    def dest(self) -> str:
        """The option's name in the parsed arguments and the cost model's options."""
        return self.flag.lstrip("-").replace("-", "_")


#: The shared mixing drivers, every synchronization strategy's adapters (its mixer,
#: :meth:`hvdx.strategy_contract.MixingStrategy.make_mixer`, is all that differs).
MIXING_DRIVERS = {
    "torch_adapter": "hvdx.torch.mixing_optimizer:adapter",
    "tensorflow_tape": "hvdx.tensorflow.mixing_tape:tape_adapter",
    "tensorflow_keras": "hvdx.tensorflow.mixing_keras:keras_adapter",
    "tensorflow_tape_counters": "hvdx.tensorflow.mixing_tape:tape_counters",
}


#: The shared compression drivers, every compression strategy's adapters (its
#: synchronizer, the descriptor's ``synchronizer``, is what differs:
#: :mod:`hvdx.core.compression_protocol`).
COMPRESSION_DRIVERS = {
    "torch_adapter": "hvdx.torch.compression_driver:adapter",
    "tensorflow_tape": "hvdx.tensorflow.compression_driver:tape_adapter",
    "tensorflow_keras": "hvdx.tensorflow.compression_driver:keras_adapter",
    "tensorflow_tape_counters": "hvdx.tensorflow.compression_driver:tape_counters",
}

#: The default adapters of each kind (a trainer names its own classes).
DRIVERS = {"sync": MIXING_DRIVERS, "compression": COMPRESSION_DRIVERS}


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
        synchronizer: for a compressor, lazy path of its synchronizer class, the step
            of its compressor, memory and communicator over mpi4py that the shared
            compression drivers run (:data:`hvdx.core.compression_protocol.
            SYNCHRONIZER_METHODS`), or ``None``.
        torch_adapter: lazy path of ``adapter(optimizer, strategy, setup, arguments)``
            (:mod:`hvdx.torch.registry`), or ``None``.
        torch_fit: lazy path of ``fit(spec, optimizer) -> spec``, which settles what
            depends on the optimizer before the cross-rank check, or ``None``.
        tensorflow_tape, tensorflow_keras: lazy paths of
            ``adapter(horovod, strategy, setup, arguments, user_object)`` for
            ``DistributedGradientTape`` and Keras' ``DistributedOptimizer``
            (:mod:`hvdx.tensorflow.registry`), or ``None``.
        tensorflow_tape_counters: lazy path of ``counters(tape, variables)`` for the
            step log, or ``None``.
        tensorflow_tape_fit: lazy path of ``fit(spec) -> spec``, the spec as
            ``DistributedGradientTape`` runs it (settled before rank 0 describes it and
            the ranks compare it), or ``None``: as it is.
        tensorflow_arguments: for a compressor, lazy path of
            ``arguments(kwargs) -> kwargs``: the keyword arguments its constructors get
            as TensorFlow's ``hvd.Compression.<name>`` (:mod:`hvdx.tensorflow.compression`)
            calls them (TopK's presets leave DGC's momentum correction out there), or
            ``None``: as given.
        torch_trainer, tensorflow_trainer: for a trainer, the lazy paths of its class.
        cost_model: its key among the cost model's layouts
            (:data:`hvdx.core.cost_model.STRATEGIES`), or ``None`` if not priced.
        cost_layout: with ``cost_model``, lazy path of its layout
            ``layout(cluster, workload, **options) -> plan`` (its folder's
            ``core_cost.py``: ``"hvdx.strategies.topk.core_cost:_topk"``), which the cost
            model prices under that key (:mod:`hvdx.core.cost.layouts`).
        cost_compared: the options of each of its entries among what the cost model
            compares by default (:data:`hvdx.core.cost_model.DEFAULT_STRATEGIES`, the
            rows of ``hvdx plan``), in order; ``{}``: its layout's defaults (the bare
            key). Read only where ``cost_model`` is set.
        state_exports: lazy paths of the public functions that give its state for a
            checkpoint (``hvdx.tensorflow.topk_state``), where there are such.
        dynamic_process_sets: whether it registers Horovod process sets while it runs,
            so that ``hvd.init`` must start Horovod in dynamic-set mode when a variable
            asks for it (DS-Sync's groups).
        built_in: ``False`` for a compressor a user registered
            (``hvdx.register_compressor``).
        examples: values its variable accepts, quoted as examples in the message of a
            refused value (:data:`hvdx.environment_variables.ACCEPTED`).
        torch_exports, tensorflow_exports: lazy paths of further public names of
            ``hvdx.torch`` / ``hvdx.tensorflow`` (its trainer's class and the TensorFlow
            ``state_exports`` are exported too), each under its attribute's name.
        bench: its rows of ``hvdx bench``'s table, in order (:class:`BenchVariant`).
        soak: the value of its variable that ``hvdx bench --soak`` trains with
            (``"topk(0.01, 0.01)"``), or ``None``: not soaked.
        plan_line: lazy path of ``line(given, cluster) -> str``, what a script writes to
            run the cost model's ``cost_model`` key with the options ``given``
            (``hvdx plan``'s ``to run`` lines).
        plan_options: its flags among ``hvdx plan``'s strategy options.
    """

    name: str
    kind: str
    title: str
    constructors: Tuple[Constructor, ...] = ()
    synchronizer: Optional[str] = None
    torch_adapter: Optional[str] = None
    torch_fit: Optional[str] = None
    tensorflow_tape: Optional[str] = None
    tensorflow_keras: Optional[str] = None
    tensorflow_tape_counters: Optional[str] = None
    tensorflow_tape_fit: Optional[str] = None
    tensorflow_arguments: Optional[str] = None
    torch_trainer: Optional[str] = None
    tensorflow_trainer: Optional[str] = None
    cost_model: Optional[str] = None
    cost_layout: Optional[Builder] = None
    # Dictionaries: left out of the hash, as BenchVariant's kwargs are.
    cost_compared: Tuple[Mapping[str, Any], ...] = field(default=({},), hash=False)
    state_exports: Tuple[str, ...] = ()
    dynamic_process_sets: bool = False
    built_in: bool = True
    examples: Tuple[str, ...] = ()
    torch_exports: Tuple[str, ...] = ()
    tensorflow_exports: Tuple[str, ...] = ()
    bench: Tuple[BenchVariant, ...] = ()
    soak: Optional[str] = None
    plan_line: Optional[str] = None
    plan_options: Tuple[PlanOption, ...] = ()

    def __post_init__(self):
        # A synchronization strategy is a mixer (hvdx.core.mixer_protocol), a
        # compression strategy a synchronizer (hvdx.core.compression_protocol), which
        # the shared drivers run: its adapters are theirs unless it names its own.
        for field_name, path in DRIVERS.get(self.kind, {}).items():
            if getattr(self, field_name) is None:
                object.__setattr__(self, field_name, path)
        # Checked here, once, so that a malformed entry fails at import (or at
        # register()), not in the middle of a job.
        if self.kind not in KINDS:
            raise ValueError(f"strategy {self.name!r}: kind={self.kind!r} must be one of "
                             f"{KINDS}")
        if self.constructors and self.kind not in VARIABLES:
            raise ValueError(f"strategy {self.name!r}: a {self.kind} is chosen by no "
                             "variable, so it has no constructors")
        if (self.cost_model is None) != (self.cost_layout is None):
            raise ValueError(f"strategy {self.name!r}: give cost_model= (its key in the "
                             "cost model) with cost_layout= (its layout), or neither")
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

    def exports(self, framework: str) -> Tuple[Tuple[str, str], ...]:
        """``(name, lazy path)`` of the public names it adds to ``hvdx.<framework>``
        (``"torch"`` or ``"tensorflow"``; ``"hvdx"``: the framework-neutral package
        itself): its TensorFlow state exports, the further exports, its trainer's class,
        and a synchronization strategy's constructors (``hvdx.DSSync``, ``hvd.DSSync``;
        a compressor's are ``hvd.Compression``'s). hvdx/__init__.py,
        hvdx/torch/__init__.py and hvdx/tensorflow/__init__.py serve each of them
        (:func:`hvdx.strategies.catalogue.module_exports`), and write out those of the
        strategies before (tests/unit/test_strategy_views.py checks that they are
        these)."""
        if framework == "torch":
            paths = self.torch_exports + (self.torch_trainer,)
        elif framework == "tensorflow":
            paths = self.state_exports + self.tensorflow_exports + (self.tensorflow_trainer,)
        elif framework == "hvdx":
            paths = ()
        else:
            raise ValueError(f"framework={framework!r} must be 'torch', 'tensorflow' or "
                             "'hvdx'")
        named = tuple((p.rpartition(":")[2].rpartition(".")[2], p) for p in paths
                      if p is not None)
        if self.kind == "sync":  # under the name its variable calls it
            named += tuple((c.name, c.build) for c in self.constructors
                           if isinstance(c.build, str))
        return named

    def lazy_paths(self) -> Tuple[Tuple[str, str], ...]:
        """``(field, path)`` of every lazy path it holds, constructors' included."""
        fields = ("synchronizer", "torch_adapter", "torch_fit", "tensorflow_tape", "tensorflow_keras",
                  "tensorflow_tape_counters", "tensorflow_arguments", "torch_trainer",
                  "tensorflow_trainer", "plan_line", "cost_layout")
        paths = [(f, getattr(self, f)) for f in fields if getattr(self, f) is not None]
        paths += [(f"constructor {c.name}", c.build) for c in self.constructors
                  if isinstance(c.build, str)]
        paths += [("state_exports", p) for p in self.state_exports]
        paths += [("torch_exports", p) for p in self.torch_exports]
        paths += [("tensorflow_exports", p) for p in self.tensorflow_exports]
        paths += [(f"bench {v.name}", v.make) for v in self.bench]
        return tuple(paths)
