"""Registered mixers: a user's own synchronization strategy (parameter mixing), by name.

::

    import numpy as np
    import hvdx

    class RandomPartner(hvdx.Mixer):
        "Average with one random partner each step; every rank draws the same pairs."

        def __init__(self, seed=0):
            self.seed = seed

        def settings(self):
            return {"seed": self.seed}

        def matrix(self, step, size):
            order = np.random.default_rng([self.seed, step]).permutation(size)
            w = np.eye(size)
            for a, b in zip(order[0::2], order[1::2]):
                w[[a, a, b, b], [a, b, a, b]] = 0.5
            return w

    hvdx.register_mixer("random_partner", RandomPartner)
    optimizer = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                         sync=hvdx.mixer("random_partner", seed=3))

After :func:`register_mixer`, ``sync=hvdx.mixer("<name>", *args, **kwargs)`` (torch's
``DistributedOptimizer``, TensorFlow's ``DistributedGradientTape`` and Keras'
``DistributedOptimizer``) and ``HVDX_SYNC=<name>(<literal arguments>)`` build a
:class:`UserMixing` spec. It runs in the parameter-mixing strategies' shared wrappers
(:mod:`hvdx.torch.mixing_optimizer`, :mod:`hvdx.tensorflow.mixing_state`), which decide
everything a mixer does not: the local step, the step counter (saved in checkpoints),
``global_every``, the SWA merge, ``synchronize_parameters()``, the optimizer state.
Those options are keywords of every registered mixer's spec
(:data:`MIXING_OPTIONS`). The fingerprint holds the class (qualified name), its
:meth:`Mixer.settings` and those options, so a rank with another mixer or argument is
refused on every rank before any exchange.

The contract (:class:`Mixer`, the protocol of every mixing strategy, built-in or
registered: :mod:`hvdx.core.mixer_protocol`): ``matrix(step, size)``, this step's ``size x size``
mixing matrix ``W`` (``x_i <- sum_j W[i, j] x_j``), the same on every rank; hvdx sends
each rank's tensors in one fused buffer per dtype family to the ranks that need them
(MPI point-to-point, :mod:`hvdx.mpi.user_mixer_exchange`). Or ``mix(step, arrays,
peers)``, a function of this rank's numpy arrays that communicates through ``peers``
(:class:`~hvdx.mpi.user_mixer_exchange.Peers`: ``by_matrix``, ``average``, ``comm``).
"""

from __future__ import annotations

import inspect
import keyword
from typing import Any, Callable, ClassVar, Dict, List, MutableMapping, Optional

from hvdx.core.mixer_protocol import MIXER_METHODS, Mixer, check_matrix
from hvdx.keywords import unexpected_keyword
from hvdx.strategies import catalogue
from hvdx.strategies.catalogue import RegisteredClassSpec, qualified, settings_of
from hvdx.strategies.descriptor import StrategyDescriptor, VARIABLES
from hvdx.strategy_contract import Job, MixingStrategy, kept_for_every_rank

__all__ = ["MIXING_OPTIONS", "Mixer", "RESERVED", "UserMixing", "check_matrix", "mixer",
           "register_mixer", "registered_mixers"]

#: The options every mixing strategy takes (:class:`hvdx.strategy_contract.MixingStrategy`),
#: keywords of every registered mixer's spec; a mixer's constructor may not use them.
MIXING_OPTIONS = ("global_every", "swa_start", "swa_every", "average_optimizer_state")

#: Names a registered mixer may not take: every strategy's key in the catalogue, every
#: name ``HVDX_SYNC`` or ``HVDX_COMPRESSION`` already accepts, and Horovod's.
RESERVED = frozenset({"none", "fp16", "horovod", "user_mixer"}) | \
    frozenset(d.name for d in catalogue.BUILT_IN) | \
    frozenset(name for variable in VARIABLES.values()
              for name in catalogue.environment_constructors(variable, built_in_only=True))


# Its entries are catalogue entries too (catalogue.ClassRegistry), built by _descriptor.
_REGISTRY: MutableMapping[str, type] = catalogue.ClassRegistry(lambda name: _descriptor(name))


def _descriptor(name: str) -> StrategyDescriptor:
    """The catalogue entry of the mixer registered as ``name``: its constructor is its
    builder (``HVDX_SYNC=<name>(...)``); its adapters are ``user_mixer``'s."""
    return catalogue.registered_entry("user_mixer", name, f"the registered mixer {name}",
                                      _builder(name))


def register_mixer(name: str, mixer_class: type) -> None:
    """Make ``sync=hvdx.mixer(name, ...)`` and ``HVDX_SYNC=<name>(...)`` build
    ``mixer_class(...)`` and run it after every local step.

    Call it on every rank, before ``hvd.init`` where ``HVDX_SYNC`` names it (``init``
    checks the variable), and before the optimizer or tape is built. Registering the
    same class again under its name does nothing.

    Raises:
        ValueError: ``name`` is not an identifier, starts with ``_``, is reserved (a
            built-in strategy's key or constructor such as ``dssync`` or ``DSSync``,
            ``topk``, ``none``), or is registered with another class (mixer or
            compressor).
        TypeError: ``mixer_class`` is not a subclass of :class:`Mixer`, implements
            neither ``matrix`` nor ``mix``, or its constructor takes one of
            :data:`MIXING_OPTIONS`.
    """
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
            or name.startswith("_"):
        raise ValueError(f"name={name!r} must be a Python identifier not starting with "
                         "'_' (it is used as hvdx.mixer(name) and in HVDX_SYNC=<name>(...))")
    if name in RESERVED:
        raise ValueError(f"name={name!r} is already a strategy of hvdx or Horovod; "
                         f"choose another name (taken: {sorted(RESERVED)})")
    if not (isinstance(mixer_class, type) and issubclass(mixer_class, Mixer)):
        raise TypeError(f"mixer_class={mixer_class!r} must be a subclass of hvdx.Mixer")
    if all(getattr(mixer_class, m) is getattr(Mixer, m) for m in MIXER_METHODS):
        raise TypeError(f"mixer_class={qualified(mixer_class)} implements neither "
                        "matrix(step, size) nor mix(step, arrays, peers)")
    _check_capabilities(mixer_class)
    try:
        taken = set(inspect.signature(mixer_class).parameters) & set(MIXING_OPTIONS)
    except (TypeError, ValueError):
        taken = set()
    if taken:
        raise TypeError(f"mixer_class={qualified(mixer_class)}: its constructor takes "
                        f"{sorted(taken)}, which every mixer's spec takes itself "
                        f"({', '.join(MIXING_OPTIONS)}); rename them")
    known = _REGISTRY.get(name)
    if known is not None and known is not mixer_class:
        raise ValueError(f"name={name!r} is already registered for {qualified(known)}; "
                         "choose another name")
    if known is None and any(d.name == name for d in catalogue.all_descriptors()):
        raise ValueError(f"name={name!r} is already a registered strategy (a compressor?); "
                         "choose another name")
    _REGISTRY[name] = mixer_class


def _check_capabilities(mixer_class: type) -> None:
    """Refuse (``TypeError``, naming the method) a capability the class declares but
    does not implement (:mod:`hvdx.core.mixer_protocol`)."""
    name = qualified(mixer_class)
    if mixer_class.combines_first is not False and mixer_class.exchange is Mixer.exchange:
        raise TypeError(f"mixer_class={name} declares combines_first but does not "
                        "implement exchange(step, everyone): the drivers overlap only a "
                        "Neighbours exchange, which exchange() returns")
    if mixer_class.state_entry is not None and not (
            isinstance(mixer_class.state_entry, str) and mixer_class.state_entry):
        raise TypeError(f"mixer_class={name}: state_entry={mixer_class.state_entry!r} "
                        "must be a key (str) or None")
    views = mixer_class.views
    if not isinstance(views, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in views.items()):
        raise TypeError(f"mixer_class={name}: views={views!r} must map names to the "
                        "mixer's attribute names (str to str)")


def registered_mixers() -> Dict[str, type]:
    """Registered name -> mixer class."""
    return dict(_REGISTRY)


def mixer(name: str, *args, **kwargs) -> "UserMixing":
    """``sync=hvdx.mixer("name", *args, global_every=..., **kwargs)``: the spec of the
    mixer registered as ``name``, built with ``args`` and ``kwargs`` (those of
    :data:`MIXING_OPTIONS` are the shared wrapper's options).

    Raises:
        ValueError: ``name`` is not registered.
        TypeError: a keyword neither the mixer's constructor nor the wrapper takes
            (naming the closest one), or arguments the constructor does not take.
    """
    if name not in _REGISTRY:
        raise ValueError(f"name={name!r} is no registered mixer (registered: "
                         f"{sorted(_REGISTRY)}); call hvdx.register_mixer({name!r}, "
                         "YourMixer) first")
    return _builder(name)(*args, **kwargs)


def _builder(name: str) -> Callable[..., "UserMixing"]:
    """The constructor ``HVDX_SYNC=<name>(...)`` calls (its signature: the mixer's and
    the mixing options)."""

    def build(*args, **kwargs) -> UserMixing:
        cls = _REGISTRY.get(name)
        if cls is None:
            raise ValueError(f"name={name!r} is no registered mixer")
        options = {k: kwargs.pop(k) for k in MIXING_OPTIONS if k in kwargs}
        signature = _signature(cls)
        if signature is not None:
            unknown = unexpected_keyword(name, _with_options(signature), kwargs)
            if unknown is not None:
                raise unknown
            try:
                signature.bind(*args, **kwargs)
            except TypeError as error:
                raise TypeError(f"{name}({_arguments(args, kwargs)}): {error}") from None
        return UserMixing(name, cls, args, kwargs, **options)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"Build sync={name}(...), the registered mixer."
    cls = _REGISTRY.get(name)
    signature = None if cls is None else _signature(cls)
    if signature is not None:
        build.__signature__ = _with_options(signature)
    return build


def _signature(cls: type) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(cls)
    except (TypeError, ValueError):
        return None


def _with_options(signature: inspect.Signature) -> inspect.Signature:
    """The mixer's signature with the mixing options as keyword-only parameters."""
    parameters = list(signature.parameters.values())
    var_kw = [p for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]
    parameters = [p for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]
    defaults = dict(global_every=0, swa_start=None, swa_every=1,
                    average_optimizer_state=False)
    parameters += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
                   for k, v in defaults.items()]
    return signature.replace(parameters=parameters + var_kw)


def _arguments(args, kwargs) -> str:
    return ", ".join([repr(a) for a in args] +
                     [f"{k}={v!r}" for k, v in sorted(kwargs.items())])


class UserMixing(RegisteredClassSpec, MixingStrategy):
    """A registered mixer, its arguments, the shared mixing options, and the instance
    every rank runs (``describe`` and ``repr``:
    :class:`~hvdx.strategies.catalogue.RegisteredClassSpec`).

    A ``ValueError`` of the mixer's constructor (or of an option) is kept, in a job of
    several ranks, and raised on every rank by the entry point
    (:func:`hvdx.strategy_contract.validating`).
    """

    argument: ClassVar[str] = "sync"
    state_key: ClassVar[str] = "hvdx_mixer"

    def __init__(self, registered_name: str, cls: type, args: tuple = (),
                 kwargs: Optional[dict] = None, global_every=0, swa_start=None,
                 swa_every=1, average_optimizer_state=False):
        #: The registry key (the catalogue entry with this mixer's adapters).
        self.name = registered_name
        self.cls = cls
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.mixer: Optional[Mixer] = None
        self.settings: List[tuple] = []
        self.global_every, self.swa_start, self.swa_every = 0, None, 1
        self.average_optimizer_state = False
        try:
            self._init_mixing(global_every=global_every, swa_start=swa_start,
                              swa_every=swa_every,
                              average_optimizer_state=average_optimizer_state)
            self.mixer = cls(*self.args, **self.kwargs)
            self.settings = settings_of(self.mixer)
        except ValueError as error:
            self.error = kept_for_every_rank(ValueError(f"{registered_name}(...): {error}"))

    def call(self) -> str:
        """``name(arguments)`` as the user wrote it, with the options that differ from
        their defaults."""
        options = {k: getattr(self, k) for k in MIXING_OPTIONS}
        defaults = dict(global_every=0, swa_start=None, swa_every=1,
                        average_optimizer_state=False)
        changed = {k: v for k, v in options.items() if v != defaults[k]}
        return f"{self.name}({_arguments(self.args, {**self.kwargs, **changed})})"

    # --- the strategy contract (hvdx.strategy_contract) ---------------------------------------

    def prepare(self, job: Job) -> Any:
        """Check the arguments against the job; a mixer by matrix gives step 0's matrix
        for this size (so a matrix of the wrong size fails on every rank, here)."""
        self.check_gradient_arguments(job, f"the mixer {self.name}")
        if type(self.mixer).mix is Mixer.mix:
            check_matrix(self.mixer.matrix(0, job.size), job.size,
                         f"{qualified(self.cls)}.matrix(0, {job.size})")
        return None

    def make_mixer(self, setup) -> Mixer:
        """The user's mixer itself (one per spec: its state is the spec's)."""
        return self.mixer

    def fingerprint_settings(self, job: Job, setup) -> List:
        return [("sync.class", qualified(self.cls)),
                ("sync.settings", repr(self.settings)),
                ("sync.size", job.size)] + \
            [(f"sync.{k}", getattr(self, k)) for k in MIXING_OPTIONS]
