"""Strategies chosen by the job's environment: ``HVDX_COMPRESSION`` and ``HVDX_SYNC``.

Horovod takes its knobs from ``HOROVOD_*`` variables; hvdx takes its strategies the same
way, so that a Horovod script whose only change is its import line
(``import hvdx.torch as hvd``) switches strategy at launch::

    mpirun -n 8 -genv HVDX_SYNC "DSSync()" python train.py
    HVDX_COMPRESSION=fast horovodrun -np 8 python train.py

The grammar (user documentation: ``docs/environment.md``)::

    HVDX_COMPRESSION = none | fast | safe | topk | topk(<literal arguments>)
    HVDX_SYNC        = none | DSSync | DSSync(...) | Decentralized | Decentralized(...)

where ``fast`` / ``safe`` are ``topk(preset="fast")`` / ``topk(preset="safe")``
(:mod:`hvdx.strategies.topk.presets`) and the arguments are those of ``hvd.Compression.topk``,
``hvdx.DSSync`` and ``hvdx.Decentralized``, positional or keyword, each a Python literal.

Every entry point (``DistributedOptimizer`` of torch and Keras,
``DistributedGradientTape``) calls :func:`choose` first:

1. an argument the code passes wins: ``compression=`` other than Horovod's
   ``Compression.none``, ``sync=`` other than ``None``; the variable for it is ignored,
   and rank 0 says so (once per entry point and value);
2. otherwise the variable, unless unset, empty or ``none``, is parsed without ``eval``
   (:func:`parse`): ``ast.parse(mode="eval")``, then only a bare name or a call of an
   accepted constructor, each argument read by ``ast.literal_eval``;
3. the spec is built by the constructor the code would call (the framework's
   ``Compression.topk``, ``hvdx.DSSync``, ``hvdx.Decentralized``), so it is validated
   the same way, and it carries ``(variable, raw value)``
   (:attr:`hvdx.strategy_contract.Strategy.environment`): the entry point's cross-rank check
   compares that entry, so a rank launched with another value fails every rank;
4. an error (syntax, an unknown name, a forbidden expression, an argument the
   constructor refuses) is a ``ValueError`` naming the variable and its value; in a job
   of several ranks it is kept and raised on every rank after the entry point's
   cross-rank check (:func:`hvdx.strategy_contract.kept_for_every_rank`);
5. one spec per framework, variable and value in a process (a TensorFlow tape is made
   every step and keeps the DS-Sync or graph state on its spec); rank 0 prints the
   choice once per entry point and value, and a strategy the code passes once per
   entry point and setting, in the same form (``HVDX_LOG_LEVEL``: :mod:`hvdx.log`);
6. an entry point that settles a strategy's settings for itself (torch's optimizer: a
   TopK preset's momentum correction; TensorFlow's tape: the order of a
   ``Decentralized`` whose value leaves it out) gives :func:`choose` its ``fit``: the
   spec as it runs there is what rank 0 describes and what :func:`choose` returns.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import os
from typing import Callable, Dict, Optional, Set, Tuple

from hvdx.environment_variables import (COMPRESSION_VARIABLE, NONE_VALUES, SYNC_VARIABLE,
                                        asks_for_dssync, call_of, expression, refused)
from hvdx import log
from hvdx.keywords import unexpected_keyword
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load
from hvdx.strategy_contract import Strategy, kept_for_every_rank

__all__ = ["COMPRESSION_VARIABLE", "SYNC_VARIABLE", "accepted_names", "asks_for_dssync",
           "check_at_init", "choose", "forget", "parse"]

# (variable, value, builder) -> the spec built from it; (entry point, variable, value)
# or (entry point, argument, setting) already printed by rank 0.
_SPECS: Dict[Tuple[str, str, Callable], Strategy] = {}
_SAID: Set[Tuple[str, str, str]] = set()


def choose(compression, sync, no_compression, constructors, what: str,
           fit: Optional[Callable[[Strategy], Strategy]] = None):
    """The entry point's ``compression`` and ``sync``, filled from the environment.

    Args:
        compression, sync: the entry point's arguments as the code passed them.
        no_compression: the framework's ``Compression.none`` (Horovod's default).
        constructors: the framework's ``Compression`` class, whose
            ``Compression.<name>`` builds a built-in strategy named in
            ``HVDX_COMPRESSION`` as that framework gives it (:func:`parse`).
        what: the entry point, for rank 0's message.
        fit: ``spec -> spec`` as it runs at this entry point (torch:
            :func:`hvdx.torch.registry.fit` with the optimizer; the tape:
            :func:`hvdx.tensorflow.registry.fit_tape`), applied to each hvdx
            strategy before rank 0 describes it, so that the line gives the settings
            that run; ``None``: each as it is.

    Returns:
        ``(compression, sync, error)``: the arguments to use, and a ``ValueError`` this
        rank kept for the cross-rank check (the arguments are then the code's).

    Raises:
        ValueError: in a job of one rank, at once (see the module docstring).
    """
    try:
        if compression is no_compression:
            compression = _chosen(COMPRESSION_VARIABLE, constructors, what, compression,
                                  fit)
        else:
            compression = _fitted(compression, fit)
            _ignored(COMPRESSION_VARIABLE, f"compression={_name(compression)}", what)
            _in_code("compression", compression, what)
        if sync is None:
            sync = _chosen(SYNC_VARIABLE, None, what, None, fit)
        else:
            sync = _fitted(sync, fit)
            _ignored(SYNC_VARIABLE, f"sync={_name(sync)}", what)
            _in_code("sync", sync, what)
    except ValueError as error:
        return compression, sync, kept_for_every_rank(error)
    return compression, sync, None


def parse(variable: str, raw: str, constructors=None) -> Optional[Strategy]:
    """The spec ``raw`` describes for ``variable`` (``None`` for ``none``), built by its
    constructor: for a built-in strategy, ``getattr(constructors, name)`` where
    ``constructors`` is given (a framework's ``Compression`` class, whose constructors
    apply the catalogue's framework arguments: TensorFlow's TopK presets leave DGC's
    momentum correction out), else the catalogue's framework-neutral one.

    Raises:
        ValueError: naming ``variable``, ``raw`` and what it accepts; a constructor's
            ``ValueError`` too, with the same prefix (in a job of several ranks the
            constructor keeps it in the spec's ``error`` instead, prefixed alike).
    """
    if raw.strip() in NONE_VALUES:
        return None
    name, args, kwargs = call_of(variable, raw)
    # The names come from the catalogue (registered compressors included); a preset is
    # a bare name for a call of its constructor.
    accepted = catalogue.environment_constructors(variable)
    found = accepted.get(name)
    if found is not None and found[0].preset is not None:
        preset = found[0]
        if not isinstance(expression(raw), ast.Name):
            raise refused(variable, raw, f"the preset {name} is a bare name; give "
                          f"arguments as {preset.calls}(preset={name!r}, ...)")
        name, kwargs = preset.calls, {"preset": preset.preset}
        found = accepted[name]
    if found is None:
        raise refused(variable, raw, f"unknown name {name!r}{_closest(name, accepted)}")
    # The framework's own constructor wins over the catalogue's framework-neutral one:
    # its arguments may differ (the entry's tensorflow_arguments).
    framework_own = constructors is not None and variable == COMPRESSION_VARIABLE and \
        found[1].built_in and isinstance(found[0].build, str)
    constructor = getattr(constructors, name) if framework_own else load(found[0].build)
    signature = inspect.signature(constructor)
    unknown = unexpected_keyword(name, signature, kwargs)  # naming the closest keyword
    if unknown is not None:
        raise refused(variable, raw, str(unknown))
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise refused(variable, raw,
                      f"{name}() does not take these arguments ({error})") from None
    try:
        spec = constructor(*args, **kwargs)
    except (TypeError, ValueError) as error:  # TypeError: a literal of the wrong type
        raise refused(variable, raw, str(error)) from None
    if spec.error is not None:  # kept for the entry point (a job of several ranks)
        object.__setattr__(spec, "error", refused(variable, raw, str(spec.error)))
    object.__setattr__(spec, "environment", (variable, raw))
    return spec


def accepted_names(variable: str) -> Tuple[str, ...]:
    """Every name ``variable`` accepts now (presets and registered compressors
    included), in the catalogue's order."""
    return tuple(catalogue.environment_constructors(variable))


def _closest(name: str, names) -> str:
    """``"; did you mean 'DSSync'?"`` for ``name`` (case aside), or ``""``."""
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def check_at_init(variable: str, raw: Optional[str]) -> None:
    """Refuse at ``hvd.init`` a value the entry point would refuse (``None``: unset), so
    that a misspelt value ends the job before the script loads its data
    (:mod:`hvdx.mpi.init_environment` calls it on every rank, after comparing the
    values). A name the variable does not know, and that a script may register, is left
    to the entry point: the script may register it after ``init``
    (``hvdx.register_compressor``, ``hvdx.register_mixer``). A name no script may
    register (a built-in strategy's in another spelling, ``dssync``; Horovod's ``fp16``:
    the registries' ``RESERVED``) is refused here.

    Raises:
        VariableError: as :func:`parse` would, with the same message.
    """
    if raw is None or raw.strip() in NONE_VALUES:
        return
    name = call_of(variable, raw)[0]
    if name not in catalogue.environment_constructors(variable, built_in_only=True) and \
            name not in _reserved(variable):
        return
    spec = parse(variable, raw)  # built by the catalogue's (framework-neutral) constructor
    if spec is not None and spec.error is not None:  # kept by the constructor
        raise spec.error


def _reserved(variable: str) -> frozenset:
    """The names ``variable``'s registry refuses to register (never a user's)."""
    if variable == COMPRESSION_VARIABLE:
        from hvdx.compression_registry import RESERVED
    else:
        from hvdx.mixer_registry import RESERVED
    return RESERVED


def forget() -> None:
    """Build fresh specs from the environment at the next entry point (and print the
    choice again). For tests and notebooks: a TensorFlow tape's DS-Sync or graph state
    lives on its spec, so a new model needs a new spec."""
    _SPECS.clear()
    _SAID.clear()


# --- choosing and saying so -------------------------------------------------------------

def _fitted(value, fit: Optional[Callable[[Strategy], Strategy]]):
    """``value`` as it runs at the entry point (:func:`choose`'s ``fit``), where it is an
    hvdx strategy; anything else (Horovod's compression classes) as it is."""
    return fit(value) if fit is not None and isinstance(value, Strategy) else value


def _chosen(variable: str, constructors, what: str, default,
            fit: Optional[Callable[[Strategy], Strategy]] = None):
    """The spec of ``variable``'s value (cached, as parsed), as ``fit`` makes it run
    here, or ``default`` if unset or none."""
    raw = os.environ.get(variable)
    if raw is None:
        return default
    key = (variable, raw, constructors)
    if key not in _SPECS:
        spec = parse(variable, raw, constructors)
        if spec is None:
            _say(what, variable, raw, "no hvdx strategy (Horovod's own default)")
            return default
        _SPECS[key] = spec
    spec = _fitted(_SPECS[key], fit)
    if spec.error is None:
        _say(what, variable, raw, _summary(spec))
    return spec


def _ignored(variable: str, passed: str, what: str) -> None:
    raw = os.environ.get(variable)
    if raw is not None and raw.strip() not in NONE_VALUES:
        _say(what, variable, raw, f"ignored: the code passes {passed}", "warning")


def _in_code(argument: str, value, what: str) -> None:
    """Rank 0 says which hvdx strategy the code passes as ``argument``, once per entry
    point and setting (a TensorFlow tape is made every step)."""
    if isinstance(value, Strategy) and value.argument == argument and value.error is None:
        summary = _summary(value)
        _said_once((what, argument, summary),
                   f"{argument} in the code: {summary} ({what})", "info")


def _say(what: str, variable: str, raw: str, text: str, severity: str = "info") -> None:
    """Rank 0 prints ``text`` once per entry point, variable and value."""
    _said_once((what, variable, raw), f"{variable}={raw!r}: {text} ({what})", severity)


def _said_once(key: Tuple[str, str, str], line: str, severity: str) -> None:
    """``line`` through :func:`hvdx.log.say`, unless said under ``key`` before (a line
    ``HVDX_LOG_LEVEL`` silences is not counted as said)."""
    if key in _SAID or not log.enabled(severity):
        return
    _SAID.add(key)
    log.say(line, severity)


def _summary(spec: Strategy) -> str:
    """The strategy's name and every setting, for rank 0's message."""
    return spec.summary(_title(spec.name))


def _title(name: str) -> str:
    """The strategy's human name (its descriptor's title), else its registry key."""
    try:
        return catalogue.descriptor(name).title
    except KeyError:
        return name


def _name(argument) -> str:
    if isinstance(argument, Strategy):
        return _summary(argument) if argument.error is None else argument.invalid_repr()
    if isinstance(argument, type):
        return argument.__name__
    return repr(argument)

