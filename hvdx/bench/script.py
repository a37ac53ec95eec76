"""What ``hvdx bench --script`` needs to know about a user's script, without running it.

- :func:`switch_imports`: the script's source with its Horovod import lines switched to
  hvdx (``import horovod.torch as hvd`` -> ``import hvdx.torch as hvd``, the same for
  ``horovod.tensorflow`` and ``horovod.tensorflow.keras``, ``from horovod import torch
  as hvd``, ``from horovod.torch import DistributedOptimizer``, ...). The imports are
  found with :mod:`ast`, so a string or a comment that reads like one is left alone;
  only the import statements are rewritten, the rest of the text is kept byte for byte.
- :func:`strategy_environment`: the variables that switch an unchanged script to a
  benchmark strategy (:mod:`hvdx.environment`: ``HVDX_COMPRESSION``, ``HVDX_SYNC``),
  with the strategy's Horovod settings (:data:`hvdx.bench.strategies.STRATEGIES`).
- :func:`parse_throughput`: the ``Iter #3: 123.4 img/sec per GPU`` lines of Horovod's
  synthetic benchmarks.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["NOT_FOR_SCRIPTS", "SCRIPT_STRATEGIES", "parse_throughput",
           "script_strategies", "split_items", "strategy_environment", "switch_imports",
           "variable_strategy"]

#: Horovod's framework modules and hvdx's drop-in for each.
FRAMEWORKS = {"horovod.torch": "hvdx.torch", "horovod.tensorflow": "hvdx.tensorflow",
              "horovod.tensorflow.keras": "hvdx.tensorflow.keras"}
#: hvdx's modules: a script importing one of them is already switched.
HVDX_MODULES = frozenset(FRAMEWORKS.values())


def _switched_module(name: Optional[str]) -> Optional[str]:
    return FRAMEWORKS.get(name or "")


def _rewrite(node: ast.stmt, script: str) -> Optional[ast.stmt]:
    """The import ``node`` with Horovod's framework modules switched, or ``None`` if it
    imports none of them."""
    if isinstance(node, ast.Import):
        names, changed = [], False
        for alias in node.names:
            target = _switched_module(alias.name)
            if target is None:
                names.append(alias)
                continue
            if alias.asname is None:
                # The script then writes horovod.torch.init(): a name hvdx cannot take.
                raise ValueError(
                    f"{script}, line {node.lineno}: 'import {alias.name}' without 'as' "
                    f"cannot be switched (the script refers to {alias.name}.*); write "
                    f"'import {alias.name} as hvd' as Horovod's examples do")
            names.append(ast.alias(name=target, asname=alias.asname))
            changed = True
        return ast.Import(names=names) if changed else None
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        target = _switched_module(node.module)
        if target is not None:  # from horovod.torch import DistributedOptimizer, ...
            return ast.ImportFrom(module=target, names=node.names, level=0)
        if node.module == "horovod":  # from horovod import torch as hvd
            frameworks = {a.name for a in node.names
                          if f"{node.module}.{a.name}" in FRAMEWORKS}
            if not frameworks:
                return None
            if len(frameworks) != len(node.names):
                others = ", ".join(a.name for a in node.names if a.name not in frameworks)
                raise ValueError(
                    f"{script}, line {node.lineno}: 'from {node.module} import ...' mixes "
                    f"frameworks with other names ({others}); import the framework on a "
                    "line of its own to let hvdx bench switch it")
            return ast.ImportFrom(module="hvdx", names=node.names, level=0)
    return None


def _imports_hvdx(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name in HVDX_MODULES for a in node.names)
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return node.module in HVDX_MODULES or any(
            f"{node.module}.{a.name}" in HVDX_MODULES for a in node.names)
    return False


def switch_imports(source: str, script: str = "the script") -> Tuple[str, List[str]]:
    """``(source with Horovod's framework imports switched to hvdx, what changed)``.

    ``what changed`` lists ``"line N: old -> new"``; it is empty for a script that
    already imports hvdx (then returned as it is).

    Raises:
        ValueError: naming ``script``: it does not parse, imports neither Horovod's
            framework modules nor hvdx's, or imports one in a form that cannot be
            switched (``import horovod.torch`` without ``as``).
    """
    try:
        tree = ast.parse(source, filename=script)
    except SyntaxError as error:
        raise ValueError(f"{script} does not parse: {error.msg} (line {error.lineno})") \
            from None
    lines = source.splitlines(keepends=True)
    edits, changes, hvdx_already = [], [], False
    for node in ast.walk(tree):
        hvdx_already = hvdx_already or _imports_hvdx(node)
        new = _rewrite(node, script)
        if new is not None:
            edits.append((node, ast.unparse(new)))
    if not edits and not hvdx_already:
        raise ValueError(
            f"{script} imports no Horovod framework module (horovod.torch, "
            "horovod.tensorflow, horovod.tensorflow.keras) and no hvdx one: hvdx bench "
            "--script runs Horovod scripts (import horovod.torch as hvd)")
    # Last first, so that earlier offsets stay valid. Offsets are UTF-8 bytes per line.
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset),
                             reverse=True):
        first, last = node.lineno - 1, node.end_lineno - 1
        head = lines[first].encode()[:node.col_offset].decode()
        tail = lines[last].encode()[node.end_col_offset:].decode()
        old = "".join(lines[first:last + 1]).strip()
        lines[first:last + 1] = [head + text + tail]
        changes.append(f"line {node.lineno}: {old} -> {text}")
    return "".join(lines), changes[::-1]


# --- strategies --------------------------------------------------------------------------

def _environment_values() -> Dict[str, Dict[str, str]]:
    """``{strategy: {HVDX_COMPRESSION or HVDX_SYNC: value}}``: the benchmark's strategies
    as :mod:`hvdx.environment` spells them (each row's ``script_env``, made with the same
    constructors and arguments as its optimizer, :mod:`hvdx.bench.strategies`)."""
    from hvdx.bench.strategies import STRATEGIES

    return {name: dict(s.script_env) for name, s in STRATEGIES.items()
            if s.script_env is not None}


def _not_for_scripts() -> Dict[str, str]:
    """Why the others cannot run a script unchanged: per strategy of the catalogue (its
    rows share the reason), and the floor."""
    from hvdx.bench.strategies import STRATEGIES

    return {s.strategy or name: s.needs_code for name, s in STRATEGIES.items()
            if s.script_env is None}


#: The strategies a script can be switched to by the environment alone.
SCRIPT_STRATEGIES = tuple(_environment_values())
#: Why the others cannot run a script unchanged.
NOT_FOR_SCRIPTS = _not_for_scripts()


def _why_not(name: str) -> Optional[str]:
    from hvdx.bench.strategies import STRATEGIES

    if name in SCRIPT_STRATEGIES:
        return None
    if name in STRATEGIES:
        return STRATEGIES[name].needs_code
    # An unknown variant of a strategy that needs code ("stanza_x"): that strategy's
    # reason; else None (the caller calls it unknown).
    from hvdx.strategies import catalogue

    group = next((d.name for d in catalogue.BUILT_IN
                  if name.startswith(d.name) and d.name in NOT_FOR_SCRIPTS), name)
    return NOT_FOR_SCRIPTS.get(group)


def variable_strategy(name: str) -> Optional[Tuple[str, str]]:
    """``(variable, value)`` of a ``--strategies`` item that sets one of hvdx's two
    variables itself, ``HVDX_COMPRESSION=<value>`` or ``HVDX_SYNC=<value>`` (a
    compressor the script registers, ``hvdx.register_compressor``; TopK, DS-Sync or a
    graph with other arguments); ``None`` for a benchmark strategy's name.

    Only the value's form is checked here (a name, or a call of one with literal
    arguments): a registered compressor exists in the script's own process alone, and
    the script's ranks check the rest as every job does.

    Raises:
        ValueError: naming the item, for an empty value or one that is not such an
            expression.
    """
    from hvdx.environment_variables import COMPRESSION_VARIABLE, SYNC_VARIABLE, call_of

    variable, sep, value = name.partition("=")
    if not sep or variable.strip() not in (COMPRESSION_VARIABLE, SYNC_VARIABLE):
        return None
    variable, value = variable.strip(), value.strip()
    if not value:
        raise ValueError(f"--strategies {name!r}: give {variable} a value, e.g. "
                         f"{variable}=my_compressor(0.01)")
    call_of(variable, value)  # its form; ValueError naming the variable and the value
    return variable, value


def strategy_environment(name: str) -> Dict[str, str]:
    """The variables of a script's MPI job under strategy ``name``: hvdx's two
    (``none`` for Horovod, so that a value in the launching shell cannot leak into the
    baseline) and the strategy's Horovod settings (none: every run keeps Horovod's
    defaults, as the baseline does). ``name`` may also set one of the two itself
    (:func:`variable_strategy`).

    Raises:
        ValueError: for a strategy that needs code, or an unknown one.
    """
    from hvdx.bench.strategies import STRATEGIES

    env = {"HVDX_COMPRESSION": "none", "HVDX_SYNC": "none"}
    given = variable_strategy(name)
    if given is not None:
        env[given[0]] = given[1]
        return env
    why = _why_not(name)
    if why is not None:
        raise ValueError(f"--strategies {name} cannot run a script: {why}")
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is unknown; choose from "
                         f"{', '.join(SCRIPT_STRATEGIES)}")
    env.update(_environment_values()[name])
    return dict(STRATEGIES[name].env, **env)


def script_strategies(names: List[str], named: bool) -> Tuple[List[str], List[str]]:
    """``(strategies to run, notes)`` for ``--strategies``. Named on the command line
    (``named``), a strategy that needs code is an error; from the default list, it is
    skipped with a note. Horovod always runs first (the baseline)."""
    from hvdx.bench.strategies import STRATEGIES

    run, notes = [], []
    for name in names:
        if variable_strategy(name) is not None:
            if name not in run:
                run.append(name)
            continue
        if name not in STRATEGIES:
            raise ValueError(f"strategy={name!r} is unknown; choose from "
                             f"{', '.join(SCRIPT_STRATEGIES)}")
        why = _why_not(name)
        if why is None:
            if name not in run:
                run.append(name)
        elif named:
            raise ValueError(f"--strategies {name} cannot run a script: {why}")
        else:
            notes.append(f"{name} skipped: {why}")
    run = ["horovod"] + [n for n in run if n != "horovod"]
    return run, notes


def split_items(text: str) -> List[str]:
    """``text`` split at the commas outside parentheses, brackets and quotes, each item
    stripped: ``"horovod,HVDX_COMPRESSION=sign(0.5, scale=True)"`` is two items."""
    items, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return items


# --- the script's own output -------------------------------------------------------------

#: Horovod's synthetic benchmarks: ``Iter #3: 123.4 img/sec per GPU``.
THROUGHPUT = re.compile(r"Iter #\s*(\d+)\s*:\s*([0-9.]+(?:[eE][-+]?\d+)?)\s*img/sec")


def parse_throughput(text: str) -> List[float]:
    """The img/sec figures of every ``Iter #N: X img/sec ...`` line, in order."""
    return [float(m.group(2)) for m in THROUGHPUT.finditer(text)]
