"""One word per concept: hvdx checks integer arguments with one function
(:func:`hvdx.core.validation.check_integer`) and counts with one base
(:class:`hvdx.core.counters.Counters`), so that a message or a counter's behaviour is
changed in one place and reads the same in every strategy.
"""

import ast
import pathlib
import re

import pytest

from hvdx.core.counters import Counters, MixingStats
from hvdx.mpi.neighbor_exchange import ExchangeStats
from hvdx.mpi.user_compression_exchange import UserCompressionStats
from hvdx.strategies.decentralized.spec import DecentralizedStats
from hvdx.strategies.dssync.mpi_groups import DSSyncStats
from hvdx.strategies.stanza.mpi_exchange import StanzaStats
from hvdx.strategies.topk.core_counters import TopKStats

pytestmark = [pytest.mark.topk, pytest.mark.stanza, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_compression]

ROOT = pathlib.Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "hvdx" / "core" / "validation.py"
MODULES = sorted((ROOT / "hvdx").rglob("*.py"))

#: The names the private copies of the integer check had, and their likes.
HELPER_NAME = re.compile(r"^_*(check_)?(positive_|nonnegative_|non_negative_)?int(eger)?$")

#: Every counters class in hvdx (``optimizer.hvdx_stats`` and the exchanges' own).
STATS = [MixingStats, DecentralizedStats, DSSyncStats, ExchangeStats, UserCompressionStats,
         TopKStats, StanzaStats]

#: Classes named ``*Stats`` that count nothing: one simulated step's figures.
NOT_COUNTERS = {"StepStats"}


def functions(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def formats_named_integer_error(function) -> bool:
    """Whether ``function`` builds ``f"{name}={value!r} must be an integer ..."`` from
    its own parameters: an integer check for any argument, whatever it is called."""
    params = {a.arg for a in function.args.args + function.args.kwonlyargs}
    for node in ast.walk(function):
        if not isinstance(node, ast.JoinedStr) or len(node.values) < 2:
            continue
        first, second = node.values[0], node.values[1]
        text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        if isinstance(first, ast.FormattedValue) and isinstance(first.value, ast.Name) \
                and first.value.id in params and isinstance(second, ast.Constant) \
                and str(second.value).startswith("=") and "must be an integer" in text:
            return True
    return False


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_but_validation_defines_an_integer_check(path):
    if path == VALIDATION:
        return
    copies = [f"{f.name} (line {f.lineno})" for f in functions(path)
              if HELPER_NAME.match(f.name) or formats_named_integer_error(f)]
    assert not copies, f"use hvdx.core.validation.check_integer instead of {copies}"


def test_the_integer_check_is_found_where_it_is_defined():
    # The detector above sees check_integer itself: it would see a copy.
    found = [f.name for f in functions(VALIDATION) if formats_named_integer_error(f)]
    assert found == ["check_integer"]


@pytest.mark.parametrize("stats", STATS, ids=lambda c: c.__name__)
def test_every_stats_class_is_counters(stats):
    assert issubclass(stats, Counters)
    assert tuple(stats().as_dict()) == tuple(stats.INITIAL)


def test_every_class_named_stats_in_hvdx_is_listed_here():
    named = {n.name for p in MODULES for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.ClassDef) and n.name.endswith("Stats")}
    assert named - NOT_COUNTERS == {c.__name__ for c in STATS}


@pytest.mark.parametrize("stats", [TopKStats, StanzaStats], ids=lambda c: c.__name__)
def test_two_counters_never_share_a_container(stats):
    one, other = stats(), stats()
    one.record(*(("control", 8, 8) if stats is StanzaStats else (8, 8, "up")))
    assert other.as_dict() == stats().as_dict() != one.as_dict()


def test_a_topk_step_is_counted_by_its_public_methods():
    stats = TopKStats()
    stats.begin_step()
    stats.record(100.0, 300.0, "up")
    stats.record(8.0, 8.0, "dense")
    stats.end_step(sparse=2, dense=1)
    stats.begin_step()
    stats.record(50.0, 50.0, "down")
    stats.end_step(sparse=1, dense=0)
    stats.record_autotune(0.2, 0.1, "topk")
    assert (stats.last_sent, stats.last_received) == (50.0, 50.0)
    assert (stats.total_sent, stats.total_received) == (158.0, 358.0)
    assert (stats.last_sparse_tensors, stats.last_dense_tensors, stats.steps) == (1, 0, 2)
    assert stats.phases == {"up": [100.0, 300.0], "down": [50.0, 50.0],
                            "agree": [0.0, 0.0], "dense": [8.0, 8.0]}
    assert stats.autotune == {"dense_s": 0.2, "topk_s": 0.1, "choice": "topk"}


def test_a_stanza_step_is_counted_by_its_public_methods_setup_in_the_totals_only():
    stats = StanzaStats()
    stats.record("setup", sent=1000)
    stats.begin_step()
    stats.record("activations", sent=64)
    stats.record("control", sent=8, received=8)
    stats.end_step()
    stats.begin_step()
    stats.record("activations", sent=32)
    stats.end_step()
    assert stats.steps == 2
    assert (stats.sent["setup"], stats.last_sent["setup"]) == (1000, 0)
    assert (stats.sent["activations"], stats.last_sent["activations"]) == (96, 32)
    assert (stats.received["control"], stats.last_received["control"]) == (8, 0)


def test_no_module_sets_a_counter_outside_its_class():
    """Counters change only through their class's public methods (``record``,
    ``begin_step``, ...): an assignment to ``<...>stats.<counter>`` elsewhere is a
    second place that knows how a counter adds up."""
    assignment = re.compile(r"stats\.[a-z_]+\s*[-+]?=[^=]|stats\.[a-z_]+\s*,\s*[\w.]+\s*=[^=]")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in MODULES
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if assignment.search(line)]
    assert found == []


def test_the_neighbour_exchange_and_dssync_count_through_their_methods():
    exchange = ExchangeStats()
    exchange.record_sent(96, 2)
    exchange.record_sent(40, 1)
    exchange.record_received(48)
    exchange.record_allocation()
    assert exchange.as_dict() == {"bytes_sent": 136, "bytes_received": 48,
                                  "last_bytes_sent": 40, "messages_sent": 3,
                                  "exchanges": 2, "allocations": 1}
    dssync = DSSyncStats()
    dssync.record_adaptation(probes=2, probe_seconds=0.5, adaptations=0)
    dssync.record_adaptation(probes=3, probe_seconds=0.75, adaptations=1, step=12)
    assert (dssync.probes, dssync.probe_seconds, dssync.adaptations,
            dssync.last_adaptation_step) == (3, 0.75, 1, 12)
