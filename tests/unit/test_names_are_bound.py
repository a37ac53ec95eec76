"""Every name a module of hvdx, its tests, scripts and examples reads is bound somewhere
in that module (imported, assigned, defined, a parameter) or is a builtin.

A coarse stand-in for a linter's undefined-name check (none is pinned here): a module
that moved a helper away and kept one call to it fails only when that line runs, which
for a benchmark's byte counter is inside an MPI job of the launcher tests. Scoping is
not modelled (a name bound anywhere in the module counts), so the check finds names
that are bound nowhere.
"""

import ast
import builtins
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted(p for folder in ("hvdx", "tests", "scripts", "examples")
                 for p in (ROOT / folder).rglob("*.py"))
MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__path__"}


def bound_names(tree: ast.AST) -> set:
    names = set(dir(builtins)) | MODULE_NAMES
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


def unbound(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    bound = bound_names(tree)
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.id}" for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            and node.id not in bound]


def test_every_module_is_read():
    assert len(MODULES) > 300


@pytest.mark.parametrize("folder", ["hvdx", "tests", "scripts", "examples"])
def test_no_module_reads_a_name_it_never_binds(folder):
    found = [line for path in MODULES if path.parts[len(ROOT.parts)] == folder
             for line in unbound(path)]
    assert found == []


def test_a_name_bound_nowhere_is_found(tmp_path):
    module = tmp_path / "moved.py"
    module.write_text("from os import sep\n\n\ndef cost(n):\n    return helper(n) + sep\n")
    tree = ast.parse(module.read_text())
    missing = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
               and isinstance(n.ctx, ast.Load) and n.id not in bound_names(tree)]
    assert missing == ["helper"]
