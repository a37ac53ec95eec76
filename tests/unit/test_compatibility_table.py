"""docs/compatibility.md is the table of tests/recipes.py, and every verdict in it is
shown by a test that exists: the page cannot drift from the project's tests."""

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import recipes  # noqa: E402


def test_the_docs_page_is_the_generated_table():
    text = recipes.PAGE.read_text()
    assert text == recipes.page_with_tables(text), \
        "docs/compatibility.md is out of date: run python tests/recipes.py"


@pytest.mark.parametrize("recipe", recipes.RECIPES, ids=lambda r: r.name[:40])
def test_every_cell_has_a_verdict_and_the_tests_that_show_it(recipe):
    assert set(recipe.cells) <= set(recipes.COLUMNS)  # the rest are untested
    cells = recipes.cells_of(recipe)
    assert set(cells) == set(recipes.COLUMNS)
    for column, cell in cells.items():
        assert cell.verdict in recipes.VERDICTS, (column, cell)
        assert bool(cell.tests) == (cell.verdict != "untested"), \
            f"{recipe.name} / {column}: a verdict needs its tests, 'untested' has none"
        for test in cell.tests:
            path, function = test.split("::")
            tree = ast.parse((ROOT / path).read_text())
            names = {node.name for node in ast.walk(tree)
                     if isinstance(node, ast.FunctionDef)}
            assert function in names, f"{test} does not exist"
