"""The benchmark's floor (every rank training alone) and its localhost fallback: every
table shows each step as a multiple of the floor's, and a run that could not build the
emulated cluster says so first and in every row (no MPI job here)."""

import pytest

from hvdx.bench.results import render_table
from hvdx.bench.run_list import ordered_runs
from hvdx.bench.strategy_run import start_cluster
from hvdx.bench.summary import FLOOR, add_floor, summarize
from hvdx.bench.strategies import STRATEGIES
from hvdx.cluster import ClusterSpec, ClusterUnavailable

pytestmark = [pytest.mark.topk, pytest.mark.stanza]


def run(strategy, step_s, workload="digits_vgg"):
    return {"workload": workload, "strategy": strategy, "ranks": 4, "steps": 10,
            "step_times": [step_s] * 10,
            "curve": [{"step": 10, "time": 10 * step_s, "quality": 0.96}],
            "hvdx_bytes_per_rank_per_step": 0.0, "ranks_detail": [{"interface_tx_rx": None}] * 4}


def test_the_floor_runs_after_horovod_once_per_workload_under_the_first_placement():
    assert ordered_runs(["horovod", "topk"], ["blocked", "interleaved"]) == [
        ("horovod", "blocked"), (FLOOR, "blocked"), ("topk", "blocked"),
        ("topk", "interleaved")]
    assert ordered_runs(["horovod", "topk"], ["blocked"], floor=False) == [
        ("horovod", "blocked"), ("topk", "blocked")]


def test_the_floor_trains_alone_and_sends_nothing():
    floor = STRATEGIES[FLOOR]
    local = object()
    assert floor.build(local, None) is local  # the local optimizer itself
    assert floor.bytes_per_step(local, None, 4, 10) == (0.0, 0.0)
    assert not floor.default and floor.init_kwargs == {}


def test_each_step_is_shown_as_a_multiple_of_the_floor_of_its_own_workload():
    rows = [summarize(run("horovod", 0.9), 0.95, "net"), summarize(run(FLOOR, 0.3), 0.95, "net"),
            summarize(run("stanza", 0.45), 0.95, "net"),
            summarize(run("horovod", 0.2, "digits_cnn"), 0.9, "net")]
    add_floor(rows)
    assert [r.floor_multiple for r in rows] == [3.0, 1.0, 1.5, None]
    table = render_table(rows)
    assert "x floor" in table.splitlines()[1] and "3.00" in table


def test_without_an_emulated_cluster_the_bench_says_so_first_and_in_every_row(monkeypatch):
    class Refusing:
        def __init__(self, spec):
            pass

        def start(self):
            raise ClusterUnavailable("no NET_ADMIN in this container")

    import hvdx.cluster

    monkeypatch.setattr(hvdx.cluster, "EmulatedCluster", Refusing)
    said = []
    cluster, network = start_cluster(ClusterSpec(), said.append)
    assert cluster is None
    assert said[0].startswith("WARNING: no emulated cluster (no NET_ADMIN in this container)")
    assert "FALLING BACK TO PLAIN LOCALHOST" in said[0]
    assert network.startswith("LOCALHOST FALLBACK")
    row = summarize(run("horovod", 0.1), 0.95, network)
    assert render_table([row]).splitlines()[0] == network


def test_an_explicit_localhost_run_is_labelled_without_alarm():
    said = []
    assert start_cluster(None, said.append) == (
        None, "localhost (no emulated bottleneck)")
    assert said == []
