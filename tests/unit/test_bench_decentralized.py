"""Decentralized SGD in the benchmark: its strategies, byte count, rank placement,
prediction and overlap table (no MPI job here)."""

import types

import pytest

from hvdx.bench.pricing import add_predictions
from hvdx.bench.results import render_table
from hvdx.bench.run_list import check_placements, ordered_runs
from hvdx.bench.strategy_run import launch_command, placement_hosts, run_name, start_cluster
from hvdx.bench.summary import Summary, summarize
from hvdx.bench.strategies import DEFAULT_STRATEGIES, STRATEGIES
from hvdx.strategies.decentralized.bench_rows import decentralized_bytes
from hvdx.cluster import ClusterSpec
from hvdx.core.cost_model import STRATEGIES as PRICED, Cluster, Prediction, Workload, predict

pytestmark = [pytest.mark.dssync, pytest.mark.decentralized]


def test_a_plain_bench_runs_the_one_peer_graph_and_its_variants_run_when_named():
    assert "decentralized" in DEFAULT_STRATEGIES
    assert "decentralized_static" not in DEFAULT_STRATEGIES
    assert "decentralized_cta" not in DEFAULT_STRATEGIES
    options = {name: STRATEGIES[name].cost_options for name in
               ("decentralized", "decentralized_static", "decentralized_cta")}
    assert options == {
        "decentralized": {"graph": "one-peer-exp", "order": "adapt_then_combine"},
        "decentralized_static": {"graph": "static-exp", "order": "adapt_then_combine"},
        "decentralized_cta": {"graph": "one-peer-exp", "order": "combine_then_adapt"}}


def test_every_priced_strategy_names_a_cost_model_that_takes_its_options():
    cluster = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit")
    workload = Workload(conv_params=1000, fc_params=10000, compute_s=0.01)
    for strategy in STRATEGIES.values():
        if strategy.cost_model is not None:
            assert strategy.cost_model in PRICED
            predict(strategy.cost_model, cluster, workload, **strategy.cost_options)


class FakeGraph:
    """``send_to`` / ``recv_from`` per step, as ``MixingGraph.neighbors`` gives them."""

    def __init__(self, send, recv):
        self.send, self.recv = send, recv

    def neighbors(self, step):
        return types.SimpleNamespace(send_to=self.send, recv_from=self.recv)


def fake_optimizer(total_bytes, send, recv, mix_every=1):
    stats = types.SimpleNamespace(total_bytes=total_bytes)
    sync = types.SimpleNamespace(mixes_at=lambda t: (t + 1) % mix_every == 0)
    return types.SimpleNamespace(hvdx_stats=stats, hvdx_graph=FakeGraph(send, recv),
                                 hvdx_strategy=sync)


def test_decentralized_bytes_are_hvdx_s_sent_count_and_as_many_received_on_a_regular_graph():
    # One-peer: 10 steps, one 5 MB model sent per step, one received.
    opt = fake_optimizer(50e6, [1], [3])
    assert decentralized_bytes(opt, None, 4, 10) == (5e6, 5e6)
    # Static exponential graph on 8 ranks: tau = 3 models each way.
    opt = fake_optimizer(150e6, [1, 2, 4], [7, 6, 4])
    assert decentralized_bytes(opt, None, 8, 10) == (15e6, 15e6)


def test_received_bytes_scale_with_in_degree_over_out_degree():
    opt = fake_optimizer(40e6, [1], [2, 3])
    assert decentralized_bytes(opt, None, 4, 8) == (5e6, 10e6)
    assert decentralized_bytes(fake_optimizer(0.0, [], []), None, 1, 8) == (0.0, 0.0)


@pytest.mark.parametrize("placement, order", [
    ("blocked", [0, 1, 2, 3, 4, 5, 6, 7]),
    ("interleaved", [0, 4, 1, 5, 2, 6, 3, 7])])
def test_placement_orders_the_emulated_hosts_for_mpiexec(placement, order):
    assert placement_hosts(ClusterSpec(racks=2, hosts_per_rack=4), placement) == order


def test_the_launch_hands_the_placement_s_host_order_to_mpiexec(monkeypatch):
    import hvdx.cluster
    from hvdx.bench import pinning

    seen = {}

    def mpiexec_command(cluster, argv, hosts=None, ppn=1, env=None):
        seen.update(hosts=hosts, ppn=ppn, env=env)
        return ["mpiexec"] + argv

    monkeypatch.setattr(hvdx.cluster, "mpiexec_command", mpiexec_command)
    cluster = types.SimpleNamespace(spec=ClusterSpec(racks=2, hosts_per_rack=2))
    command, env = launch_command(cluster, 1, ["prog"], 4, {"HOROVOD_CYCLE_TIME": "50"},
                                   "interleaved")
    assert command == ["mpiexec"] + pinning.command(["prog"]) and env == {}
    assert seen["hosts"] == [0, 2, 1, 3]
    assert seen["env"]["HVDX_BENCH_PLACEMENT"] == "interleaved"
    assert seen["env"]["HOROVOD_CYCLE_TIME"] == "50"


def test_horovod_runs_once_under_the_first_placement_and_the_others_under_each():
    assert ordered_runs(["horovod", "decentralized", "dssync"], ["blocked", "interleaved"]) == [
        ("horovod", "blocked"), ("floor", "blocked"), ("decentralized", "blocked"),
        ("dssync", "blocked"), ("decentralized", "interleaved"), ("dssync", "interleaved")]
    assert ordered_runs(["decentralized"], ["interleaved"], floor=False) == [
        ("horovod", "interleaved"), ("decentralized", "interleaved")]
    assert run_name("w", "decentralized", "interleaved") == "w-decentralized-interleaved"
    assert run_name("w", "horovod", "blocked") == run_name("w", "horovod", None) == \
        "w-horovod"


@pytest.mark.parametrize("placements, named", [
    (["random"], "--placement='random'"), ([""], "--placement=''"),
    (["blocked", "blocked"], "names a placement twice")])
def test_bad_placements_are_refused_naming_them(placements, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        check_placements(placements)


def test_a_bad_placement_exits_2_before_anything_runs(capsys):
    from hvdx.bench.cli import main

    assert main(["--placement", "blocked,diagonal", "--workloads", "digits_vgg"]) == 2
    assert "--placement='diagonal'" in capsys.readouterr().err


def result(strategy, placement, step_s=0.5, ranks=8):
    return {"workload": "digits_vgg", "strategy": strategy, "ranks": ranks, "steps": 10,
            "step_times": [step_s] * 10,
            "curve": [{"step": 10, "time": 10 * step_s, "quality": 0.96}],
            "hvdx_bytes_per_rank_per_step": 5.48e6,
            "ranks_detail": [{"interface_tx_rx": None}] * ranks,
            "parameter_split": (55_000, 1_350_000), "parameters": 1_405_000,
            "compute_s": 0.05, "cost_options": STRATEGIES[strategy].cost_options,
            "placement": placement}


def test_predictions_price_each_run_under_its_own_placement(monkeypatch):
    import hvdx.core.cost_model

    asked = []

    def recorded(strategy, cluster, workload, *args, **options):
        asked.append((strategy, cluster.placement, options))
        return Prediction(strategy, strategy, 0.1, 0.0, 0.0, "none", (), 8)
    monkeypatch.setattr(hvdx.core.cost_model, "predict", recorded)
    spec = ClusterSpec(racks=2, hosts_per_rack=4, nic="1gbit", uplink="100mbit")
    raw = [result("horovod", "blocked"), result("decentralized", "blocked"),
           result("decentralized", "interleaved")]
    rows = [summarize(r, 0.95, "net") for r in raw]
    add_predictions(rows, raw, spec)
    options = STRATEGIES["decentralized"].cost_options
    assert asked == [("horovod", "blocked", {}), ("decentralized", "blocked", options),
                     ("decentralized", "interleaved", options)]


def test_the_table_names_the_placement_only_when_it_varies():
    rows = [summarize(result("horovod", "blocked"), 0.95, "net"),
            summarize(result("decentralized", "interleaved"), 0.95, "net")]
    assert "decentralized@interleaved" in render_table(rows)
    assert "horovod@blocked" in render_table(rows)
    plain = render_table([summarize(result("horovod", "blocked"), 0.95, "net")])
    assert "@" not in plain
    local = summarize(dict(result("horovod", None)), 0.95, "net")
    assert local.placement is None and "@" not in render_table([local])


def test_summary_keeps_its_positional_fields():
    # New fields come last, with defaults: older callers build rows as before.
    row = Summary("w", "horovod", "net", 4, 10, 0.1, None, 0.9, 0.9, 1.0, 1.0, None, None)
    assert row.placement is None and row.predicted_step_s is None


def test_a_flat_cluster_is_named_as_such(monkeypatch):
    class FakeCluster:
        def __init__(self, spec):
            self.spec = spec

        def start(self):
            return self

        def configured_rate(self, target):
            return self.spec.nic if target.startswith("h") else self.spec.uplink

    import hvdx.cluster

    monkeypatch.setattr(hvdx.cluster, "EmulatedCluster", FakeCluster)
    _, network = start_cluster(ClusterSpec(racks=1, hosts_per_rack=8, nic="100mbit"),
                               print)
    assert network == "emulated flat 8 hosts (1 rack), NIC 100mbit"
    _, network = start_cluster(ClusterSpec(racks=2, hosts_per_rack=4), print)
    assert network == "emulated 2x4, NIC 1gbit, uplink 100mbit"


def test_the_overlap_table_sets_each_mode_against_the_local_optimizer():
    from hvdx.bench.overlap import render

    row = {"workload": "digits_vgg", "ranks": 4, "model_bytes": 5_620_000,
           "modes": {"local": {"median_s": 0.100, "mean_s": 0.110, "sent_per_step": 0.0},
                     "atc": {"median_s": 0.105, "mean_s": 0.121, "sent_per_step": 5.62e6},
                     "cta": {"median_s": 0.102, "mean_s": 0.110, "sent_per_step": 5.62e6}}}
    text = render([row])
    assert "| digits_vgg | local | 100.0 | 110.0 | 1.000 | 1.000 | 0.000 |" in text
    assert "| digits_vgg | atc | 105.0 | 121.0 | 1.050 | 1.100 | 5.620 |" in text
    assert "x local <= 1.1" in text


def test_the_overlap_measurement_refuses_what_it_cannot_time():
    from hvdx.bench.overlap import run

    with pytest.raises(ValueError, match="workload='mnist'"):
        run(["mnist"])
    with pytest.raises(ValueError, match="mode='dense'"):
        run(["digits_vgg"], modes=("local", "dense"))
    with pytest.raises(ValueError, match="--ranks=1"):
        run(["digits_vgg"], ranks=1)


def test_an_exchange_left_in_flight_is_completed_on_the_clock_before_an_evaluation():
    # Adapt-then-combine leaves the exchange in flight past step(); the evaluation's
    # forward pass would complete it off the clock. Synchronous strategies need nothing.
    calls = []
    opt = types.SimpleNamespace(synchronize=lambda: calls.append("synchronize"))
    for name, strategy in STRATEGIES.items():
        if name.startswith("decentralized"):
            strategy.before_eval(opt)
        else:
            assert strategy.before_eval is None, name
    assert calls == ["synchronize"] * 3


def test_the_closing_figures_count_the_run_before_the_consensus_distance_completes_more():
    stats = types.SimpleNamespace(total_messages=10, steps=10, global_steps=0)

    def consensus_distance():
        stats.total_messages, stats.steps = 11, 11  # a combine-then-adapt exchange lands
        return 0.25

    opt = types.SimpleNamespace(hvdx_stats=stats, consensus_distance=consensus_distance)
    figures = STRATEGIES["decentralized_cta"].final_stats(opt, 10)
    assert figures == {"messages_per_step": 1.0, "exchanges": 10, "global_steps": 0,
                       "consensus_distance": 0.25}
