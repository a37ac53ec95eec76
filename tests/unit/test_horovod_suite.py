"""scripts/horovod_suite's pure parts: the import switch, and how the ranks' outcomes
and an interrupted job become one outcome per test (no MPI, no Horovod files)."""

import importlib.util
import json
import pathlib
import sys

import pytest

pytestmark = [pytest.mark.topk]

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "horovod_suite.py"
_spec = importlib.util.spec_from_file_location("horovod_suite", _PATH)
suite = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = suite  # dataclasses look their module up there
_spec.loader.exec_module(suite)

SOURCE = ('"""Tests for horovod.tensorflow.keras."""\n'
          "from horovod.common.util import is_version_greater_equal_than\n"
          "import horovod.keras as hvd_keras\n"
          "import horovod.tensorflow.keras as hvd\r\n"
          "x = 'import horovod.tensorflow.keras as hvd'\n")


def test_only_the_hvd_import_line_is_switched():
    out = suite.rewrite_imports(SOURCE, "keras")
    assert out == SOURCE.replace("import horovod.tensorflow.keras as hvd\r\n",
                                 "import hvdx.tensorflow.keras as hvd\r\n")


def test_a_file_without_the_line_once_is_refused():
    with pytest.raises(ValueError, match="once in the torch suite, found it 0 times"):
        suite.rewrite_imports(SOURCE, "torch")


@pytest.mark.parametrize("per_rank, outcome", [
    (["pass", "pass"], "pass"),
    (["pass", "fail"], "fail"),
    (["skip", "fail"], "fail"),
    (["skip", "pass"], "pass"),
    (["skip", "skip"], "skip"),
    (["pass", None], None),
])
def test_a_test_fails_if_it_fails_on_any_rank(per_rank, outcome):
    assert suite.combine(per_rank) == outcome


def _log(*events):
    return suite.read_rank_log(json.dumps(e) + "\n" for e in events)


def test_a_killed_job_blames_the_earliest_test_a_rank_did_not_finish():
    order = ["a", "b", "c", "d"]
    # Rank 0 finished b and went on to c; rank 1 is stuck in b's collective.
    rank0 = _log({"start": "a"}, {"finish": "a", "outcome": "pass"},
                 {"start": "b"}, {"finish": "b", "outcome": "fail"}, {"start": "c"})
    rank1 = _log({"start": "a"}, {"finish": "a", "outcome": "skip"}, {"start": "b"})
    assert suite.decide(order, [rank0, rank1], "hang") == {"a": "pass", "b": "hang"}
    assert suite.decide(order, [rank0, rank1], None) == {"a": "pass"}


def test_a_last_line_still_being_written_is_ignored():
    log = suite.read_rank_log(['{"pid": 7}\n', '{"start": "a"}\n', '{"finish": "a", "out'])
    assert (log.pid, log.started, log.finished) == (7, ["a"], {})


def test_only_rows_that_differ_from_the_baseline_are_shown():
    results = {"same": {"horovod": "pass", "topk": "pass"},
               "worse": {"horovod": "pass", "topk": "hang"},
               "not reached": {"horovod": "skip"}}
    assert suite.differing(results, ["horovod", "topk"], "horovod") == ["worse"]


def test_a_failure_is_told_by_its_exception_line_once_for_ranks_that_agree():
    report = "    def test_x(self):\n>       hvd.allreduce(t)\nE   ValueError: bad\nE   more\n"
    assert suite.failure_line(report) == "more"
    assert suite.failure_reason(["more", None, "more"]) == "ranks 0, 2: more"
    assert suite.failure_reason([None, "a"]) == "rank 1: a"
