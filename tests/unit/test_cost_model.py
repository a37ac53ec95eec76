"""The alpha-beta cost model prices each strategy's traffic on the links it really uses."""

import math
import re

import pytest

from hvdx.core.cost_model import (
    Cluster,
    Workload,
    compare,
    format_rate,
    host_order,
    parse_rate,
    parse_time,
    predict,
    prediction_error,
    speedup,
    speedup_over_horovod,
    topk_pair_bytes,
)
from hvdx.core.units import format_time, parse_count

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

VGG16 = Workload.from_total(138e6, 0.9, 0.1, activation_size=25088)


def cluster(racks=2, hosts=2, nic="1gbit", uplink="100mbit", **kwargs):
    return Cluster(racks=racks, hosts_per_rack=hosts, nic_bps=nic, uplink_bps=uplink,
                   **kwargs)


def phase(prediction, name):
    return next(p for p in prediction.phases if p.name == name)


def dense_ring_bytes(n, workload=VGG16):
    return 2 * (n - 1) / n * workload.model_bytes


# --- horovod ---------------------------------------------------------------------------

def test_ring_bytes_per_rank_are_the_bandwidth_optimal_2_n_minus_1_over_n():
    for racks, hosts in ((1, 2), (2, 2), (4, 8)):
        p = predict("horovod", cluster(racks, hosts), VGG16)
        assert p.bytes_per_rank == pytest.approx(dense_ring_bytes(racks * hosts))


def test_ring_time_grows_linearly_in_model_size():
    c = cluster(latency_s=0)
    small, large = (Workload(conv_params=0, fc_params=m, compute_s=0) for m in (10**6, 10**7))
    assert predict("horovod", c, large).comm_s == \
        pytest.approx(10 * predict("horovod", c, small).comm_s)


def test_ring_is_bounded_by_the_uplink_when_it_is_slower_than_the_nic():
    c = cluster(racks=4, hosts=4, latency_s=0)
    p = predict("horovod", c, VGG16)
    assert p.bottleneck == "uplink"
    assert p.comm_s == pytest.approx(8 * dense_ring_bytes(16) / c.uplink_bps)


def test_a_rack_ordered_ring_puts_one_flow_on_each_uplink_whatever_the_oversubscription():
    c = Cluster.from_oversubscription(8, 32, "25gbit", 4, latency_s=0)
    p = predict("horovod", c, VGG16)
    assert phase(p, "ring allreduce").uplink_bytes == pytest.approx(dense_ring_bytes(256))
    assert p.bottleneck == "nic"  # 200gbit uplink, 25gbit NIC: the slowest hop is the NIC
    assert p.comm_s == pytest.approx(8 * dense_ring_bytes(256) / 25e9)


def test_one_rank_communicates_nothing():
    p = predict("horovod", cluster(1, 1), VGG16)
    assert p.comm_s == 0 and p.bytes_per_rank == 0 and p.step_s == VGG16.compute_s


# --- hierarchical ----------------------------------------------------------------------

@pytest.mark.parametrize("racks", [2, 4, 8])
def test_hierarchical_beats_the_flat_ring_when_the_uplink_is_slower_than_nic_over_racks(racks):
    c = cluster(racks, 4, nic="10gbit", uplink=f"{10 / racks / 2:g}gbit")
    assert predict("hierarchical", c, VGG16).comm_s < predict("horovod", c, VGG16).comm_s


def test_hierarchical_moves_fewer_bytes_over_the_uplink_than_the_flat_ring():
    c = cluster(4, 8)
    flat = predict("horovod", c, VGG16).phases[0].uplink_bytes
    cross = phase(predict("hierarchical", c, VGG16), "cross-rack allreduce of shards")
    assert cross.uplink_bytes == pytest.approx(2 * 3 / 4 * VGG16.model_bytes)
    assert cross.uplink_bytes < flat


def test_hierarchical_needs_far_fewer_latency_rounds():
    c = cluster(8, 32, nic="100gbit", uplink="100gbit", latency_s=1e-3)
    tiny = Workload(conv_params=1000, fc_params=0, compute_s=0)
    assert predict("hierarchical", c, tiny).comm_s < predict("horovod", c, tiny).comm_s / 3


def test_hierarchical_is_the_flat_ring_with_one_rack():
    c = cluster(1, 8)
    assert predict("hierarchical", c, VGG16).bytes_per_rank == \
        pytest.approx(predict("horovod", c, VGG16).bytes_per_rank)


# --- topk ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 8])
def test_sharded_topk_at_one_percent_sends_at_most_2_5_percent_of_the_dense_ring(n):
    p = predict("topk", cluster(2, n // 2), VGG16, ratio=0.01, mode="sharded")
    assert p.bytes_per_rank <= 0.025 * dense_ring_bytes(n)


def test_sharded_downlink_bytes_are_flat_in_n_while_gathered_grows_linearly():
    def downlink(mode, n):
        p = predict("topk", cluster(n // 4, 4), VGG16, ratio=0.01, mode=mode)
        return p.phases[-1].sent_bytes
    sharded = [downlink("sharded", n) for n in (4, 8, 16, 32)]
    gathered = [downlink("gathered", n) for n in (4, 8, 16, 32)]
    assert max(sharded) / min(sharded) < 4 / 3  # (n-1)/n: from 3/4 towards 1
    assert [g / gathered[0] for g in gathered] == pytest.approx([1, 7 / 3, 15 / 3, 31 / 3])


def test_gathered_topk_sends_n_minus_1_times_k_pairs():
    p = predict("topk", cluster(2, 4), VGG16, ratio=0.01)
    assert p.bytes_per_rank == 7 * math.ceil(0.01 * VGG16.params) * 8


def test_topk_pair_bytes_are_a_rounded_up_count_of_int32_index_and_float32_value():
    # 1% of 1,370,634 is 13,706.34 pairs: 13,707; 2% is 27,412.68: 27,413.
    assert topk_pair_bytes(1_370_634, 0.01) == (13_707 * 8, 13_707 * 8)
    assert topk_pair_bytes(1_370_634, 0.01, 0.02) == (13_707 * 8, 27_413 * 8)
    assert topk_pair_bytes(10, 1.0, bytes_per_element=2) == (60, 60)
    with pytest.raises(ValueError, match="downlink_ratio=0"):
        topk_pair_bytes(10, 0.5, 0)


def test_topk_at_ratio_one_costs_no_less_than_dense():
    for n_racks, hosts in ((1, 2), (2, 2), (2, 4)):
        c = cluster(n_racks, hosts)
        dense = predict("horovod", c, VGG16)
        for mode in ("gathered", "sharded"):
            p = predict("topk", c, VGG16, ratio=1.0, mode=mode)
            assert p.bytes_per_rank >= dense.bytes_per_rank
            assert p.comm_s >= dense.comm_s * (1 - 1e-9)


def test_sharded_alltoall_is_uplink_bound_when_racks_are_oversubscribed():
    c = Cluster.from_oversubscription(8, 32, "25gbit", 4)
    p = predict("topk", c, VGG16, mode="sharded")
    assert phase(p, "alltoall of top-k pairs to shard owners").bottleneck == "uplink"


# --- dssync ----------------------------------------------------------------------------

def test_dssync_intra_rack_phase_has_zero_uplink_bytes():
    p = predict("dssync", cluster(4, 4), VGG16)
    assert phase(p, "intra-rack group allreduce").uplink_bytes == 0
    assert phase(p, "cross-rack group allreduce").uplink_bytes > 0


def test_dssync_amortizes_the_cross_phase_over_the_period():
    c = cluster(2, 4)
    p = predict("dssync", c, VGG16, intra_phases=3)
    assert [x.weight for x in p.phases] == [3 / 4, 1 / 4]
    assert p.comm_s == pytest.approx(sum(x.weight * x.seconds for x in p.phases))


def test_fewer_crossing_ranks_load_the_uplink_proportionally_less():
    c = cluster(2, 4)
    all_cross = phase(predict("dssync", c, VGG16), "cross-rack group allreduce")
    one_cross = phase(predict("dssync", c, VGG16, cross_ranks=1),
                      "cross-rack group allreduce")
    assert all_cross.uplink_bytes == pytest.approx(4 * one_cross.uplink_bytes)


@pytest.mark.parametrize("racks, hosts", [(1, 8), (8, 1)])
def test_dssync_with_one_group_of_everyone_is_horovod(racks, hosts):
    c = cluster(racks, hosts)
    assert predict("dssync", c, VGG16).comm_s == \
        pytest.approx(predict("horovod", c, VGG16).comm_s)


# --- decentralized SGD over graphs ------------------------------------------------------

def uplink_models_by_phase(p, workload=VGG16):
    """Models through the busiest uplink, one way, per phase name."""
    return {x.name: x.uplink_bytes / workload.model_bytes for x in p.phases}


@pytest.mark.parametrize("n_racks, hosts", [(2, 2), (2, 4), (1, 8), (8, 32)])
def test_one_peer_exp_graph_sends_exactly_one_model_per_step(n_racks, hosts):
    p = predict("decentralized", cluster(n_racks, hosts), VGG16, graph="one-peer-exp")
    assert p.bytes_per_rank == pytest.approx(VGG16.model_bytes)
    assert p.label == "decentralized one-peer-exp"


@pytest.mark.parametrize("n_racks, hosts, tau", [(2, 2, 2), (2, 4, 3), (2, 8, 4)])
def test_static_exp_graph_sends_tau_models_per_step(n_racks, hosts, tau):
    p = predict("decentralized", cluster(n_racks, hosts), VGG16, graph="static-exp")
    assert p.bytes_per_rank == pytest.approx(tau * VGG16.model_bytes)
    assert len(p.phases) == 1 and p.phases[0].weight == 1


def test_the_one_peer_period_is_priced_as_its_mean():
    p = predict("decentralized", cluster(2, 4), VGG16)
    assert [x.weight for x in p.phases] == pytest.approx([1 / 3] * 3)
    assert p.comm_s == pytest.approx(sum(x.seconds for x in p.phases) / 3)


def test_ring_and_complete_graphs_send_two_and_n_minus_1_models():
    c = cluster(2, 4)
    assert predict("decentralized", c, VGG16, graph="ring").bytes_per_rank == \
        pytest.approx(2 * VGG16.model_bytes)
    assert predict("decentralized", c, VGG16, graph="complete").bytes_per_rank == \
        pytest.approx(7 * VGG16.model_bytes)


def test_blocked_placement_sends_every_flow_of_a_hop_of_a_rack_or_more_across_the_uplink():
    p = predict("decentralized", cluster(4, 4), VGG16, graph="one-peer-exp")
    assert uplink_models_by_phase(p) == {"send model to i+1": 1, "send model to i+2": 2,
                                         "send model to i+4": 4, "send model to i+8": 4}


def test_interleaved_placement_keeps_the_long_hops_inside_the_racks():
    # 2 racks x 4 hosts, rank r in rack r mod 2: only the odd hop (distance 1) crosses,
    # then with all 4 flows of each rack; distances 2 and 4 stay inside.
    p = predict("decentralized", cluster(2, 4, placement="interleaved"), VGG16)
    assert uplink_models_by_phase(p) == {"send model to i+1": 4, "send model to i+2": 0,
                                         "send model to i+4": 0}
    blocked = predict("decentralized", cluster(2, 4), VGG16)
    assert uplink_models_by_phase(blocked) == {"send model to i+1": 1,
                                               "send model to i+2": 2,
                                               "send model to i+4": 4}
    # Per period: 4 models over each uplink interleaved, 7 blocked.
    assert p.comm_s < blocked.comm_s
    static = {pl: phase(predict("decentralized", cluster(2, 4, placement=pl), VGG16,
                                graph="static-exp"), "send model to i+1, i+2, i+4")
              for pl in ("blocked", "interleaved")}
    assert static["blocked"].uplink_bytes == pytest.approx(7 * VGG16.model_bytes)
    assert static["interleaved"].uplink_bytes == pytest.approx(4 * VGG16.model_bytes)


def test_a_ring_in_interleaved_rank_order_crosses_the_uplink_at_every_hop():
    blocked = predict("horovod", cluster(2, 4), VGG16).phases[0]
    interleaved = predict("horovod", cluster(2, 4, placement="interleaved"), VGG16).phases[0]
    assert blocked.uplink_bytes == pytest.approx(dense_ring_bytes(8))
    assert interleaved.uplink_bytes == pytest.approx(4 * dense_ring_bytes(8))


def test_groups_inside_a_rack_follow_the_placement():
    for strategy in ("dssync", "hierarchical"):
        p = predict(strategy, cluster(2, 4, placement="interleaved"), VGG16)
        assert all(x.uplink_bytes == 0 for x in p.phases if x.name.startswith("intra-rack"))
        assert p.comm_s == pytest.approx(predict(strategy, cluster(2, 4), VGG16).comm_s)


def test_on_a_flat_cluster_one_peer_moves_n_over_2_n_minus_1_of_the_ring_s_bytes():
    c = cluster(1, 8, nic="100mbit", latency_s=0)
    ring, graph = predict("horovod", c, VGG16), predict("decentralized", c, VGG16)
    assert graph.bottleneck == ring.bottleneck == "nic"
    assert graph.comm_s == pytest.approx(8 * VGG16.model_bytes / 1e8)
    assert ring.comm_s / graph.comm_s == pytest.approx(2 * 7 / 8)


def test_combine_then_adapt_overlaps_the_exchange_with_the_compute():
    c = cluster(1, 8, nic="100mbit")
    atc = predict("decentralized", c, VGG16)
    cta = predict("decentralized", c, VGG16, order="combine_then_adapt")
    assert cta.comm_s == pytest.approx(atc.comm_s) and cta.label.endswith(" cta")
    assert atc.step_s == pytest.approx(VGG16.compute_s + atc.comm_s)
    assert cta.step_s == pytest.approx(max(VGG16.compute_s, cta.comm_s))
    assert not predict("horovod", c, VGG16).overlap


def test_mixing_every_other_step_halves_the_exchange():
    c = cluster(2, 4)
    every, other = (predict("decentralized", c, VGG16, mix_every=m) for m in (1, 2))
    assert other.bytes_per_rank == pytest.approx(every.bytes_per_rank / 2)
    assert other.comm_s == pytest.approx(every.comm_s / 2)


def test_mixing_every_other_step_prices_each_mix_of_the_period_once():
    # The graph follows the mixes: on 8 ranks with mix_every = 2, the 6 steps of a
    # period hold the mixes with hops 1, 2 and 4, one each, so each weighs 1/6.
    p = predict("decentralized", cluster(2, 4), VGG16, mix_every=2)
    weights = {x.name: x.weight for x in p.phases}
    assert weights == pytest.approx({"send model to i+1": 1 / 6, "send model to i+2": 1 / 6,
                                     "send model to i+4": 1 / 6})


def test_one_rank_exchanges_nothing():
    p = predict("decentralized", cluster(1, 1), VGG16)
    assert p.comm_s == 0 and p.bytes_per_rank == 0


def test_placements_lay_hosts_out_rack_by_rack_or_in_turn():
    assert host_order("blocked", 2, 4) == list(range(8))
    assert host_order("interleaved", 2, 4) == [0, 4, 1, 5, 2, 6, 3, 7]
    assert host_order("interleaved", 4, 2) == [0, 2, 4, 6, 1, 3, 5, 7]
    c = cluster(2, 2, ranks_per_host=2, placement="interleaved")
    assert c.host_of_rank.tolist() == [0, 0, 2, 2, 1, 1, 3, 3]
    assert c.rack_of_rank.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="placement='random'"):
        host_order("random", 2, 2)
    with pytest.raises(ValueError, match="Cluster.placement='random'"):
        cluster(2, 2, placement="random")


# --- stanza ----------------------------------------------------------------------------

def test_stanza_with_one_fc_worker_never_sends_fc_parameters():
    c = cluster(2, 4)
    light, heavy = (Workload(conv_params=10**6, fc_params=f, compute_s=0.1,
                             activation_size=25088) for f in (10**6, 10**9))
    a, b = predict("stanza", c, light), predict("stanza", c, heavy)
    assert a.bytes_per_rank == b.bytes_per_rank and a.comm_s == b.comm_s


def test_stanza_moves_two_batches_of_activations_per_conv_worker():
    p = predict("stanza", cluster(2, 4), VGG16)
    one_way = VGG16.batch_size * VGG16.activation_size * VGG16.bytes_per_element
    sent = phase(p, "activations to FC workers").sent_bytes + \
        phase(p, "activation gradients to conv workers").sent_bytes
    assert sent * 8 == pytest.approx(2 * 7 * one_way)  # 7 conv workers, means over 8 ranks


def test_stanza_with_several_fc_workers_allreduces_the_fc_parameters_among_them():
    c = cluster(2, 4)
    one, two = (predict("stanza", c, VGG16, fc_workers=f) for f in (1, 2))
    name = "conv allreduce (and FC allreduce if F > 1)"
    fc_bytes = VGG16.fc_params * VGG16.bytes_per_element
    # Two FC workers (ranks 6 and 7, both in rack 1) allreduce the head over their NICs.
    assert phase(two, name).nic_bytes >= fc_bytes > phase(one, name).nic_bytes
    assert two.data_ranks == 6 and one.data_ranks == 7


def test_stanza_is_priced_in_the_trainers_layout_the_last_f_ranks_serving_contiguous_groups():
    # 2 x 2 hosts, two FC workers: ranks 2 and 3 (rack 1) serve ranks 0 and 1 (rack 0):
    # all activations cross the uplink, the FC allreduce stays inside rack 1.
    p = predict("stanza", cluster(2, 2), VGG16, fc_workers=2)
    one_way = VGG16.batch_size * VGG16.activation_size * VGG16.bytes_per_element
    assert phase(p, "activations to FC workers").uplink_bytes == pytest.approx(2 * one_way)
    # The rings: conv among ranks 0, 1 (rack 0), FC among 2, 3 (rack 1): nothing crosses.
    assert phase(p, "conv allreduce (and FC allreduce if F > 1)").uplink_bytes == 0


def test_the_busiest_fc_worker_runs_the_head_for_all_its_conv_workers():
    w = Workload.from_total(138e6, 0.9, 0.1, fc_compute_fraction=0.01)
    p = predict("stanza", cluster(2, 4), w)
    assert p.compute_s == pytest.approx(0.1 * (0.99 + 7 * 0.01))


# --- compare, speedup, error -----------------------------------------------------------

def test_compare_orders_by_time_per_batch_and_includes_horovod():
    ranked = compare(cluster(2, 2), VGG16)
    times = [p.seconds_per_batch for p in ranked]
    assert times == sorted(times)
    assert "horovod" in [p.strategy for p in ranked]


def test_compare_hands_each_strategy_only_the_options_it_takes():
    ranked = compare(cluster(2, 2), VGG16, ["topk", "dssync"], ratio=0.1, cross_ranks=1)
    assert {p.label for p in ranked} == {"topk gathered 0.1", "dssync intra=1 cross=1"}


def test_speedup_of_horovod_over_itself_is_one():
    c = cluster(2, 2)
    assert speedup_over_horovod(predict("horovod", c, VGG16), c, VGG16) == 1.0
    fast = predict("topk", c, VGG16, mode="sharded")
    assert speedup(fast, predict("horovod", c, VGG16)) > 1


def test_prediction_error_is_relative_and_signed():
    assert prediction_error(1.1, 1.0) == pytest.approx(0.1)
    assert prediction_error(predict("horovod", cluster(1, 1), VGG16), 0.2) == \
        pytest.approx(-0.5)
    with pytest.raises(ValueError, match="measured=0"):
        prediction_error(1.0, 0)


# --- units and validation --------------------------------------------------------------

def test_rates_parse_like_tc():
    assert parse_rate("100mbit") == 1e8 and parse_rate("1gbit") == 1e9
    assert parse_rate("25gbit") == 25e9 and parse_rate(5e6) == 5e6
    assert format_rate(25e9) == "25gbit" and format_rate(1.25e10) == "12.5gbit"
    assert parse_time("25us") == pytest.approx(25e-6) and parse_time("1ms") == 1e-3


@pytest.mark.parametrize("text, count", [
    ("100M", 1e8), ("100m", 1e8), ("1.5k", 1500), ("2G", 2e9), ("138e6", 138e6),
    ("42", 42), (7, 7)])
def test_counts_take_si_prefixes_as_rates_do(text, count):
    assert parse_count(text, "--params") == count


@pytest.mark.parametrize("value", ["100X", "100MB", "-5M", "many", None])
def test_a_count_that_is_not_one_names_the_argument_and_the_value(value):
    with pytest.raises(ValueError, match=re.escape(f"--params={value!r}")):
        parse_count(value, "--params")


@pytest.mark.parametrize("seconds, text", [
    (25e-6, "25us"), (0.005, "5ms"), (1.5, "1.5s"), (0.0, "0us")])
def test_a_time_is_written_in_its_largest_unit_and_reads_back(seconds, text):
    assert format_time(seconds) == text
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["100mbps", "100", "fast", "-1gbit", 0, True, None])
def test_bad_rates_name_the_argument_and_the_value(value):
    with pytest.raises(ValueError, match=r"--nic=.*must|--nic=.*not"):
        parse_rate(value, "--nic")


@pytest.mark.parametrize("field, value", [
    ("racks", 0), ("hosts_per_rack", 1.5), ("ranks_per_host", -1), ("nic_bps", "fast"),
    ("uplink_bps", 0), ("latency_s", -1.0), ("intra_host_bps", "1gbps")])
def test_cluster_errors_name_the_field_and_the_value(field, value):
    fields = dict(racks=2, hosts_per_rack=2, nic_bps=1e9, uplink_bps=1e8)
    with pytest.raises(ValueError, match=re.escape(f"Cluster.{field}={value!r}")):
        Cluster(**{**fields, field: value})


def test_oversubscription_sets_the_uplink():
    c = Cluster.from_oversubscription(8, 32, "25gbit", 4)
    assert c.uplink_bps == 200e9 and c.oversubscription == 4 and c.ranks == 256
    with pytest.raises(ValueError, match="oversubscription=0"):
        Cluster.from_oversubscription(8, 32, "25gbit", 0)


@pytest.mark.parametrize("kwargs, name", [
    (dict(conv_params=-1, fc_params=1, compute_s=0), "conv_params=-1"),
    (dict(conv_params=0, fc_params=0, compute_s=0), "fc_params=0"),
    (dict(conv_params=1, fc_params=1, compute_s=-1), "compute_s=-1"),
    (dict(conv_params=1, fc_params=1, compute_s=0, batch_size=0), "batch_size=0"),
    (dict(conv_params=1, fc_params=1, compute_s=0, fc_compute_fraction=2), "fraction=2")])
def test_workload_errors_name_the_field_and_the_value(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Workload(**kwargs)


@pytest.mark.parametrize("strategy, options, message", [
    ("ring", {}, "strategy='ring'"),
    ("horovod", {"ratio": 0.1}, "no option ratio"),
    ("topk", {"ratio": 0}, "ratio=0"),
    ("topk", {"ratio": 0.1, "mode": "dense"}, "mode='dense'"),
    ("topk", {"mode": "sharded", "downlink_ratio": 1.5}, "downlink_ratio=1.5"),
    ("dssync", {"cross_ranks": 9}, "cross_ranks=9"),
    ("dssync", {"intra_phases": -1}, "intra_phases=-1"),
    ("decentralized", {"graph": "one_peer"}, "graph='one_peer'"),
    ("decentralized", {"order": "adapt"}, "order='adapt'"),
    ("decentralized", {"mix_every": 0}, "mix_every=0"),
    ("stanza", {"fc_workers": 8}, "fc_workers=8")])
def test_bad_strategies_and_options_are_named(strategy, options, message):
    with pytest.raises(ValueError, match=message):
        predict(strategy, cluster(2, 4), VGG16, **options)


# --- the strategy table -----------------------------------------------------------------

def test_the_priced_strategies_and_the_default_comparison_are_pinned():
    """The cost model's keys and what compare() and hvdx plan price by default, in their
    order (the table is built from the strategy catalogue: this pins what it builds)."""
    from hvdx.core.cost_model import DEFAULT_STRATEGIES, STRATEGIES

    assert list(STRATEGIES) == ["horovod", "hierarchical", "topk", "dssync",
                                "decentralized", "stanza"]
    assert DEFAULT_STRATEGIES == (
        "horovod", "hierarchical", ("topk", {"mode": "gathered"}),
        ("topk", {"mode": "sharded"}), "dssync",
        ("decentralized", {"graph": "static-exp"}),
        ("decentralized", {"graph": "one-peer-exp"}),
        ("decentralized", {"graph": "one-peer-exp", "order": "combine_then_adapt"}),
        "stanza")
    assert [type(e) for e in DEFAULT_STRATEGIES] == \
        [str, str, tuple, tuple, str, tuple, tuple, tuple, str]
