"""hvdx's modules import each other one way: no module reaches itself again through its
imports, those inside functions included, and neither do the subpackages as wholes
(``hvdx.mpi`` does not import back up into a spec module that imports ``hvdx.mpi``).

The imports are read from the source (``ast``), not by importing, so an import inside a
function that a test never calls counts too; those under ``if TYPE_CHECKING:`` do not.

The shared MPI machinery (``hvdx/mpi/``) does not reach into a strategy's folder: no
strategy's spec, nothing of decentralized SGD's or Stanza's (their shared parts, the
neighbour exchange and the mixers' counters, live in hvdx.mpi and hvdx.core).
"""

import ast
import pathlib
from typing import Dict, List, Set

import pytest

import hvdx

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

ROOT = pathlib.Path(hvdx.__file__).parent
SUBPACKAGES = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


def _modules() -> Dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("hvdx",) + path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _known(name: str) -> str:
    """``name``, or the nearest enclosing module of it (``pkg.mod.function``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> Set[str]:
    """The hvdx modules ``module`` imports, and the packages that importing them runs
    (``import hvdx.mpi.comm`` runs ``hvdx/mpi/__init__.py`` too)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []  # types only: never imported at run time
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
    targets = set()
    for name in names:
        if name.split(".")[0] != "hvdx":
            continue
        target = _known(name)
        parts = target.split(".")
        targets |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    # The packages around ``module`` are imported before it: not edges of its own.
    around = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
    return targets - around


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of two or more nodes (Tarjan):

    1. depth-first from every unvisited node, numbering nodes in visit order;
    2. a node's low link is the smallest number reachable through the stack;
    3. a node whose low link is its own number closes a component.
    """
    number: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found = []

    def visit(node: str) -> None:
        number[node] = low[node] = len(number)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in number:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], number[nxt])
        if low[node] == number[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in number:
            visit(node)
    return found


def _describe(cycles: List[List[str]], graph: Dict[str, Set[str]]) -> str:
    return "\n".join(" <-> ".join(c) + ": " + "; ".join(
        f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in cycles)


def _layer(module: str) -> str:
    """The subpackage a module belongs to, or the module itself.

    A strategy's folder (hvdx/strategies/<name>/) holds a module per layer, named
    for it: ``core_*.py`` belongs to hvdx.core, ``mpi_*.py`` to hvdx.mpi,
    ``torch/`` to hvdx.torch, ``tensorflow/`` to hvdx.tensorflow; its
    ``descriptor.py`` to hvdx.strategies (the catalogue); the rest (``spec.py``,
    ``presets.py``) are modules of their own, as the specs at the top were.
    """
    parts = module.split(".")
    if len(parts) >= 4 and parts[1] == "strategies":
        role = parts[3].split("_")[0]
        if role in SUBPACKAGES:
            return f"hvdx.{role}"
        if parts[3] != "descriptor":
            return module
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in SUBPACKAGES else module


def test_no_module_imports_itself_back():
    graph = {m: _imports(m) for m in MODULES}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + _describe(cycles, graph)


def test_no_subpackage_imports_back_into_what_imports_it():
    graph: Dict[str, Set[str]] = {}
    for module in MODULES:
        layer = _layer(module)
        graph.setdefault(layer, set()).update(
            _layer(t) for t in _imports(module) if _layer(t) not in (layer, "hvdx"))
    cycles = _cycles(graph)
    assert not cycles, "import cycles between subpackages and modules:\n" + \
        _describe(cycles, graph)


#: ``hvdx/mpi/`` modules that may import a strategy folder's module, and which one.
#: hvdx.mpi.calibration_set_averages (the calibration tool's step 9) times the allreduce
#: on the process sets DS-Sync registers, so it asks DS-Sync's groups for those sets
#: (inside a function, at run time); nothing else under hvdx/mpi/ imports a strategy's
#: folder.
MPI_IMPORTS_OF_STRATEGIES = {("hvdx.mpi.calibration_set_averages",
                              "hvdx.strategies.dssync.mpi_groups")}


def _strategy_folders() -> Set[str]:
    return {m.split(".")[2] for m in MODULES
            if m.startswith("hvdx.strategies.") and MODULES[m].parent.name != "strategies"}


def _mpi_imports_of_strategies() -> Set[tuple]:
    """(module under hvdx/mpi/, module of a strategy's folder it imports): the folders'
    packages themselves (``hvdx.strategies.dssync``, run on the way) left out."""
    folders = _strategy_folders()
    return {(m, t) for m in MODULES if m == "hvdx.mpi" or m.startswith("hvdx.mpi.")
            for t in _imports(m)
            if t.count(".") >= 3 and t.split(".")[1] == "strategies"
            and t.split(".")[2] in folders}


def test_mpi_imports_no_strategy_spec():
    specs = sorted((m, t) for m, t in _mpi_imports_of_strategies()
                   if t.split(".")[3] == "spec")
    assert not specs, f"hvdx/mpi/ imports a strategy's spec: {specs}"


def test_mpi_imports_nothing_of_decentralized_or_stanza():
    found = sorted((m, t) for m in MODULES if m == "hvdx.mpi" or m.startswith("hvdx.mpi.")
                   for t in _imports(m)
                   if t.split(".")[1:3] in (["strategies", "decentralized"],
                                            ["strategies", "stanza"]))
    assert not found, f"hvdx/mpi/ imports decentralized SGD's or Stanza's modules: {found}"


def test_mpi_imports_of_strategy_folders_are_the_listed_ones():
    found = _mpi_imports_of_strategies()
    assert found <= MPI_IMPORTS_OF_STRATEGIES, \
        f"hvdx/mpi/ imports a strategy's folder: {sorted(found - MPI_IMPORTS_OF_STRATEGIES)}"
    # The list names imports that are still there, so it cannot keep a stale allowance.
    assert found == MPI_IMPORTS_OF_STRATEGIES, \
        f"no longer imported, drop from the list: {sorted(MPI_IMPORTS_OF_STRATEGIES - found)}"


def test_the_strategy_imports_are_read():
    assert {"decentralized", "dssync", "stanza", "topk"} <= _strategy_folders()
    # An import inside a function counts (hvdx.mpi.calibration_set_averages's is one).
    assert "hvdx.strategies.dssync.mpi_groups" in \
        _imports("hvdx.mpi.calibration_set_averages")
    assert "hvdx.strategies.dssync.mpi_groups" in \
        _imports("hvdx.strategies.dssync.mixer")


def test_the_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _layer("hvdx.mpi.comm") == "hvdx.mpi"
    assert _layer("hvdx.strategies.dssync.spec") == "hvdx.strategies.dssync.spec"
    assert _layer("hvdx.strategies.topk.core_global") == "hvdx.core"
    assert _layer("hvdx.strategies.topk.mpi_sync") == "hvdx.mpi"
    assert _layer("hvdx.strategies.stanza.tensorflow.trainer") == "hvdx.tensorflow"
    assert _layer("hvdx.strategies.stanza.torch") == "hvdx.torch"
    assert _layer("hvdx.strategies.topk.descriptor") == "hvdx.strategies"
