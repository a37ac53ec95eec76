"""Registered compressors: a user's own compressor with error feedback, by name.

::

    import hvdx

    class ScaledSign(hvdx.Compressor): ...       # compress, decompress, settings

    hvdx.register_compressor("scaled_sign", ScaledSign)
    optimizer = hvd.DistributedOptimizer(opt, compression=hvd.Compression.scaled_sign())

After :func:`register_compressor`, ``hvd.Compression.<name>(*args, **kwargs)`` (torch
and TensorFlow) and ``HVDX_COMPRESSION=<name>(<literal arguments>)`` build a
:class:`UserCompression` spec, which the entry points resolve and check across ranks
like every strategy (:mod:`hvdx.strategy_contract`): the fingerprint holds the compressor's
class (qualified name) and its :meth:`~hvdx.core.compression_protocol.Compressor.settings`,
so a rank with another setting fails on every rank. The algorithm is
:mod:`hvdx.core.user_compression`; the shared compression drivers run it
(:mod:`hvdx.torch.compression_driver`, :mod:`hvdx.tensorflow.compression_driver`).
"""

from __future__ import annotations

import inspect
import keyword
from typing import Callable, ClassVar, Dict, List, MutableMapping, Optional, Tuple

from hvdx.core.compression_protocol import Compressor, check_compressor_class
from hvdx.strategies import catalogue
from hvdx.strategies.catalogue import RegisteredClassSpec, qualified, settings_of
from hvdx.strategies.descriptor import Constructor, StrategyDescriptor, VARIABLES, load
from hvdx.strategy_contract import CompressionStrategy, kept_for_every_rank

__all__ = ["RESERVED", "Registered", "UserCompression", "builder", "built_in_constructor",
           "register_compressor", "registered"]

#: Names that already mean something as ``hvd.Compression.<name>`` or in
#: ``HVDX_COMPRESSION`` (Horovod's, and the built-in compressions' constructors and
#: presets in the catalogue: ``topk``, ``fast``, ``safe``), or as a strategy's key in
#: the catalogue, where a registered compressor becomes an entry of its own.
RESERVED = frozenset({"none", "fp16", "Compressor", "NoneCompressor", "FP16Compressor"}) | \
    frozenset(catalogue.environment_constructors(VARIABLES["compression"],
                                                 built_in_only=True)) | \
    frozenset(d.name for d in catalogue.BUILT_IN)

#: The strategy whose adapters every registered compressor runs with.
_ADAPTERS_OF = "user_compression"


# Its entries are catalogue entries too (catalogue.ClassRegistry), built by _descriptor.
_REGISTRY: MutableMapping[str, type] = catalogue.ClassRegistry(lambda name: _descriptor(name))


def _descriptor(name: str) -> StrategyDescriptor:
    """The catalogue entry of the compressor registered as ``name``: its constructor is
    its builder (``HVDX_COMPRESSION=<name>(...)``); its adapters are those of
    ``user_compression``, which its specs name (their ``name`` is that key)."""
    return catalogue.registered_entry(
        _ADAPTERS_OF, name, f"the registered compressor {name} with error feedback",
        builder(name))


def register_compressor(name: str, compressor_class: type) -> None:
    """Make ``hvd.Compression.<name>(...)`` and ``HVDX_COMPRESSION=<name>(...)`` build
    ``compressor_class(...)`` and run it with error feedback.

    Call it on every rank, before the optimizer or tape is built. Registering the same
    class again under its name does nothing.

    Raises:
        ValueError: ``name`` is not an identifier, starts with ``_``, is reserved
            (``none``, ``fp16``, ``topk``, the presets ``fast`` and ``safe``, a
            built-in strategy's key such as ``dssync``), or is
            registered with another class.
        TypeError: ``compressor_class`` is not a subclass of :class:`hvdx.Compressor`,
            lacks ``compress`` or ``decompress``, or declares a memory or communicator
            hvdx does not have (:func:`hvdx.core.compression_protocol.check_compressor_class`).
    """
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) \
            or name.startswith("_"):
        raise ValueError(f"name={name!r} must be a Python identifier not starting with "
                         "'_' (it is used as hvd.Compression.<name> and in "
                         "HVDX_COMPRESSION=<name>(...))")
    if name in RESERVED:
        raise ValueError(f"name={name!r} is already hvdx's or Horovod's compression or "
                         "strategy; "
                         f"choose another name (taken: {sorted(RESERVED)})")
    if not (isinstance(compressor_class, type) and issubclass(compressor_class, Compressor)):
        raise TypeError(f"compressor_class={compressor_class!r} must be a subclass of "
                        "hvdx.Compressor")
    check_compressor_class(compressor_class)
    known = _REGISTRY.get(name)
    if known is not None and known is not compressor_class:
        raise ValueError(f"name={name!r} is already registered for {qualified(known)}; "
                         "choose another name")
    _REGISTRY[name] = compressor_class


def registered() -> Dict[str, Callable]:
    """Registered name -> the builder of its spec (for ``HVDX_COMPRESSION``)."""
    return {name: builder(name) for name in _REGISTRY}


def builder(name: str) -> Callable[..., "UserCompression"]:
    """``hvd.Compression.<name>``: builds the :class:`UserCompression` of ``name``.

    Raises:
        AttributeError: ``name`` is not registered.
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise AttributeError(name)

    def build(*args, **kwargs) -> UserCompression:
        return UserCompression(name, cls, args, kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"Build compression={name}(...): {qualified(cls)} with error feedback."
    build.hvdx_builds = "compression"  # refused uncalled (hvdx.strategy_contract.strategy_of)
    try:  # help() and HVDX_COMPRESSION's check of the arguments see the constructor's
        build.__signature__ = inspect.signature(cls)
    except (TypeError, ValueError):
        pass
    return build


def built_in_constructor(name: str) -> Optional[Tuple[Constructor, StrategyDescriptor]]:
    """The built-in compression strategy's constructor called ``name`` (by its lazy
    path; a preset is none) and its catalogue entry, or ``None``."""
    found = catalogue.environment_constructors(VARIABLES["compression"],
                                               built_in_only=True).get(name)
    return found if found is not None and isinstance(found[0].build, str) else None


class Registered(type):
    """The metaclass of the frameworks' ``Compression`` classes: an attribute they do
    not have is a built-in compression strategy's constructor, as the catalogue lists
    it (a new built-in compressor edits neither framework's ``Compression``), else a
    registered compressor's builder, even one registered after import."""

    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        found = built_in_constructor(name)
        if found is not None:
            return load(found[0].build)
        try:
            return builder(name)
        except AttributeError:
            raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r} "
                                 "(a compressor of your own: hvdx.register_compressor("
                                 f"{name!r}, YourCompressor) first)") from None


class UserCompression(RegisteredClassSpec, CompressionStrategy):
    """A registered compressor, its arguments, and the instance every rank runs
    (``describe`` and ``repr``: :class:`~hvdx.strategies.catalogue.RegisteredClassSpec`).

    A ``ValueError`` of the compressor's constructor is kept, in a job of several
    ranks, and raised on every rank by the entry point (:func:`hvdx.strategy_contract.validating`);
    a ``TypeError`` (arguments it does not take) is raised at once, as by any call. Its
    job checks (``op`` Average or Sum, ``gradient_predivide_factor`` 1) are
    :meth:`~hvdx.strategy_contract.CompressionStrategy.prepare`'s.
    """

    name: ClassVar[str] = "user_compression"
    argument: ClassVar[str] = "compression"
    title: ClassVar[str] = "a registered compressor"

    def __init__(self, registered_name: str, cls: type, args: tuple = (),
                 kwargs: Optional[dict] = None):
        self.registered_name = registered_name
        self.cls = cls
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.compressor: Optional[Compressor] = None
        #: ``compressor.settings()`` as sorted ``(key, value)`` pairs.
        self.settings: List[tuple] = []
        try:
            self.compressor = cls(*self.args, **self.kwargs)
            self.settings = settings_of(self.compressor)
        except ValueError as error:
            self.error = kept_for_every_rank(
                ValueError(f"{registered_name}(...): {error}"))

    def call(self) -> str:
        """``name(arguments)`` as the user wrote it (rank-independent for literals)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in
                                                sorted(self.kwargs.items())]
        return f"{self.registered_name}({', '.join(parts)})"

    def fingerprint_settings(self, job, setup) -> List:
        """The class and its settings (also in :meth:`describe`, which is the
        ``compression`` entry: TensorFlow's entry points compare that one)."""
        return [("compression.class", qualified(self.cls)),
                ("compression.settings", repr(self.settings))]
