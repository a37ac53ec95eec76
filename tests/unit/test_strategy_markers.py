"""Each strategy's tests can be found: a test module that names a strategy carries its
marker, so ``pytest -m dssync`` runs every test of DS-Sync (tests/conftest.py registers
one marker per catalogue entry, from the catalogue).

The rule, checked over every test module of every directory:

1. a module *names* a catalogue entry when its text holds, as a whole word, one of the
   entry's names: its registry name (``dssync``), its constructors and the classes or
   functions they build (``DSSync``, ``topk``), and what the frameworks export for it
   (``dssync_state``, ``Stanza``); for the entries that stand for what users register,
   the functions that register them and the specs they build (:data:`ALSO_NAMED`);
2. a module carries an entry's marker in its module-level ``pytestmark``;
3. every module that names an entry carries its marker, and every marker a module
   carries is registered: an entry of the catalogue, or one of the suite's own
   (``mpi``, ``up_to_two_ranks``) or pytest's (``skipif``).
"""

import ast
import pathlib
import re
from typing import Dict, Set

import pytest

from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import StrategyDescriptor

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.user_mixer, pytest.mark.stanza]

TESTS = pathlib.Path(__file__).resolve().parents[1]

#: The entries whose strategies users name themselves: how a test names them instead.
ALSO_NAMED = {"user_compression": ("register_compressor", "UserCompression"),
              "user_mixer": ("register_mixer", "UserMixing")}


def names_of(entry: StrategyDescriptor) -> Set[str]:
    """The words by which a test module names ``entry`` (rule 1)."""
    names = {entry.name} | set(ALSO_NAMED.get(entry.name, ()))
    for constructor in entry.constructors:
        if constructor.build is not None:  # (a preset, "fast", is too common a word)
            names.add(constructor.name)
        if isinstance(constructor.build, str):
            names.add(constructor.build.rpartition(":")[2])
    for framework in ("hvdx", "torch", "tensorflow"):
        names |= {name for name, _ in entry.exports(framework)}
    return names


def named_entries(text: str) -> Set[str]:
    """The catalogue entries that a test module's ``text`` names."""
    return {entry.name for entry in catalogue.BUILT_IN
            if any(re.search(rf"\b{re.escape(name)}\b", text) for name in names_of(entry))}


def module_markers(text: str) -> Set[str]:
    """The markers of a module's ``pytestmark`` (``pytest.mark.<name>``, called or not)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and \
                any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return set()


def modules() -> Dict[str, str]:
    """Every test module's path (from tests/) -> its text."""
    return {str(path.relative_to(TESTS)): path.read_text()
            for path in sorted(TESTS.glob("*/**/test_*.py"))}


def test_every_catalogue_entry_is_a_marker(pytestconfig):
    registered = {line.split(":")[0].split("(")[0] for line in pytestconfig.getini("markers")}
    assert {entry.name for entry in catalogue.BUILT_IN} <= registered


def test_a_module_that_names_a_strategy_carries_its_marker():
    missing = {path: sorted(named_entries(text) - module_markers(text))
               for path, text in modules().items()}
    assert {path: names for path, names in missing.items() if names} == {}, \
        "add these markers to the modules' pytestmark"


def test_every_marker_of_a_module_is_registered(pytestconfig):
    registered = {line.split(":")[0].split("(")[0] for line in pytestconfig.getini("markers")}
    unknown = {path: sorted(module_markers(text) - registered)
               for path, text in modules().items()}
    assert {path: names for path, names in unknown.items() if names} == {}, \
        "a marker that names no catalogue entry (nor one of the suite's own)"


@pytest.mark.parametrize("text, named", [
    ("sync=hvdx.DSSync('shuffle')", {"dssync"}),
    ("hvd.Compression.topk(0.01)", {"topk"}),
    ("HVDX_COMPRESSION=fast", set()),  # a preset is named through its constructor
    ("hvdx.register_mixer('half', Half)", {"user_mixer"}),
    ("from hvdx.tensorflow import dssync_state, Stanza", {"dssync", "stanza"}),
    ("topk_method='sampled_threshold'", set()),  # a word of its own
])
def test_what_names_a_strategy(text, named):
    assert named_entries(text) == named


def test_the_markers_of_a_module():
    text = ("import pytest\n"
            "pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.skipif(True, reason='x'),"
            " pytest.mark.dssync]\n")
    assert module_markers(text) == {"mpi", "skipif", "dssync"}
    assert module_markers("import pytest\n") == set()
