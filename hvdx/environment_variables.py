"""The variables that choose a strategy, ``HVDX_COMPRESSION`` and ``HVDX_SYNC``, and
how a value is read: what :mod:`hvdx.environment` builds specs from, and what
``hvd.init`` compares across ranks (:mod:`hvdx.mpi.init_environment`).

A value is read without ``eval`` (the grammar: :mod:`hvdx.environment`):

1. ``ast.parse(mode="eval")``; anything but a bare name or a call of a name is refused;
2. every argument is read by ``ast.literal_eval``, so nothing but the literals is
   evaluated;
3. a refusal is a :class:`VariableError` (a ``ValueError``) naming the variable, its
   value and what it accepts (:data:`ACCEPTED`).
"""

from __future__ import annotations

import ast
from typing import Optional, Tuple

from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import VARIABLES

__all__ = ["ACCEPTED", "COMPRESSION_VARIABLE", "NONE_VALUES", "SYNC_VARIABLE",
           "VariableError", "asks_for_dssync", "call_of", "expression", "refused"]

COMPRESSION_VARIABLE = VARIABLES["compression"]
SYNC_VARIABLE = VARIABLES["sync"]


def _accepted(variable: str) -> str:
    """What ``variable`` accepts, from the catalogue's built-in strategies of its kind:
    ``none``, the presets, the constructors, and each strategy's ``examples``."""
    entries = catalogue.of_kind(catalogue.variable_kind(variable), built_in_only=True)
    builders = [c.name for d in entries for c in d.constructors if c.preset is None]
    presets = [c.name for d in entries for c in d.constructors if c.preset is not None]
    names = ", ".join(["none"] + presets + builders)
    if len(builders) == 1:
        calls = f"{names} or {builders[0]}(...)"
    else:
        calls = f"{names}, or a call of {'either' if len(builders) == 2 else 'any of them'}"
    examples = " or ".join(f'"{e}"' for d in entries for e in d.examples)
    return f"{calls} with literal arguments, e.g. {examples}"


#: What each variable accepts, for error messages (the built-in strategies: a
#: registered compressor's name is accepted too, and named where it is the closest).
ACCEPTED = {variable: _accepted(variable) for variable in (COMPRESSION_VARIABLE,
                                                            SYNC_VARIABLE)}

#: Words that mean "no hvdx strategy", as an unset variable.
NONE_VALUES = ("", "none")


class VariableError(ValueError):
    """A value of ``HVDX_COMPRESSION`` or ``HVDX_SYNC`` that hvdx refuses, or one that
    differs between ranks.

    Raised on every rank alike (by ``hvd.init``, or by the entry point after its
    cross-rank check), with a message that says all there is to fix, so a traceback
    through hvdx's internals would only hide it: hvdx's hook for uncaught exceptions
    (:mod:`hvdx.mpi.abort`) prints the message alone, once, on rank 0, and ends every
    rank with a non-zero status.
    """


def asks_for_dssync(raw: Optional[str]) -> bool:
    """Whether ``HVDX_SYNC=raw`` names DS-Sync (``DSSync`` or ``DSSync(...)``), whatever
    its arguments; ``False`` for anything unparsable (the entry point reports that).

    Read from the catalogue: the strategies whose descriptor says
    ``dynamic_process_sets`` (DS-Sync registers its groups' process sets as it runs, so
    ``hvd.init`` must start Horovod in dynamic-set mode for them).
    """
    try:
        name = None if raw is None else call_of(SYNC_VARIABLE, raw)[0]
    except ValueError:
        return False
    found = catalogue.environment_constructors(SYNC_VARIABLE).get(name)
    return found is not None and found[1].dynamic_process_sets


def expression(raw: str) -> ast.expr:
    """``raw`` parsed as one Python expression (``SyntaxError`` if it is not one)."""
    return ast.parse(raw.strip(), mode="eval").body


def call_of(variable: str, raw: str) -> Tuple[str, tuple, dict]:
    """``(name, args, kwargs)`` of ``raw``, a bare name or a call of a name whose
    arguments are literals; nothing is evaluated but the literals."""
    try:
        node = expression(raw)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        raise refused(variable, raw, f"not an expression ({error.__class__.__name__}: "
                      f"{getattr(error, 'msg', error)})") from None
    if isinstance(node, ast.Name):
        return node.id, (), {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise refused(variable, raw, "neither a name nor a call of one")
    if any(isinstance(a, ast.Starred) for a in node.args) or \
            any(k.arg is None for k in node.keywords):
        raise refused(variable, raw, "* and ** arguments are not accepted")
    args = tuple(_literal(variable, raw, a) for a in node.args)
    kwargs = {k.arg: _literal(variable, raw, k.value) for k in node.keywords}
    return node.func.id, args, kwargs


def _literal(variable: str, raw: str, node: ast.expr):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise refused(variable, raw, f"the argument {ast.unparse(node)!r} is not a "
                      "Python literal (a number, string, True/False/None, or a "
                      "list, tuple or dict of them)") from None


def refused(variable: str, raw: str, reason: str) -> VariableError:
    """The error for ``variable=raw``: ``reason``, then what the variable accepts."""
    end = " " if reason.endswith("?") else ". "  # "...; did you mean 'ratio'?"
    return VariableError(f"{variable}={raw!r}: {reason}{end}{variable} accepts "
                         f"{ACCEPTED[variable]}")
