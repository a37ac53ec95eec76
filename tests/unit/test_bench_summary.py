"""The benchmark's table: speedups are ratios to the Horovod run of the same workload."""

import pytest

from hvdx.bench.results import render_table
from hvdx.bench.summary import add_speedups, mean_step, summarize

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]


def result(strategy, step_s, curve, rx=None, ranks=4, steps=10):
    return {"workload": "w", "strategy": strategy, "ranks": ranks, "steps": steps,
            "step_times": [step_s] * steps, "curve": curve,
            "hvdx_bytes_per_rank_per_step": 1e6,
            "ranks_detail": [{"interface_tx_rx": None if rx is None else [rx, rx]}] * ranks}


CURVE = [{"step": 5, "time": 1.0, "quality": 0.5}, {"step": 10, "time": 2.0, "quality": 0.95}]


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    row = summarize(result("horovod", 0.2, CURVE), 0.9, "net")
    assert row.time_to_target_s == 2.0 and row.final_quality == 0.95


def test_bits_per_byte_reach_their_target_from_above_and_the_table_says_the_unit():
    from hvdx.bench.workloads import BITS_PER_BYTE

    curve = [{"step": 5, "time": 1.0, "quality": 5.1}, {"step": 10, "time": 2.0, "quality": 3.9}]
    row = summarize(result("horovod", 0.2, curve), 4.0, "net", BITS_PER_BYTE)
    assert row.time_to_target_s == 2.0 and row.final_quality == 3.9
    assert summarize(result("horovod", 0.2, curve), 3.5, "net",
                     BITS_PER_BYTE).time_to_target_s is None
    assert "3.900 bpb" in render_table([row])


def test_an_unreached_target_has_no_time():
    assert summarize(result("horovod", 0.2, CURVE), 0.99, "net").time_to_target_s is None


def test_interface_bytes_are_per_rank_per_step_and_compared_with_hvdx_count():
    row = summarize(result("horovod", 0.2, CURVE, rx=10.5e6), 0.9, "net")
    assert row.interface_rx_per_step == 1.05e6
    assert abs(row.bytes_agreement - 1.05) < 1e-12


def test_speedups_divide_horovods_times_by_the_strategys():
    rows = [summarize(result("horovod", 0.4, CURVE), 0.9, "net"),
            summarize(result("other", 0.1, [dict(CURVE[1], time=0.5)]), 0.9, "net")]
    add_speedups(rows)
    assert rows[0].step_speedup == 1.0 and rows[1].step_speedup == 4.0
    assert rows[1].target_speedup == 4.0
    table = render_table(rows)
    assert "net" in table.splitlines()[0] and "4.00" in table


def test_the_plan_error_is_against_the_mean_step_after_warm_up_so_rare_steps_count():
    # Two warm-up steps, then a schedule of cheap steps and one expensive one (DS-Sync's
    # crossing): the median (0.6) leaves it out, the mean after warm-up is 0.4.
    run = dict(result("dssync", 0.2, CURVE, steps=6), step_times=[9.0, 9.0, 0.2, 0.2, 0.2, 1.0])
    row = summarize(run, 0.9, "net")
    assert row.median_step_s == 0.6
    assert abs(row.mean_step_s - 0.4) < 1e-12
    row.predicted_step_s = 0.5
    assert abs(row.prediction_error - 0.25) < 1e-12
    assert "400.0" in render_table([row]) and "+25%" in render_table([row])


def test_the_mean_step_covers_whole_periods_of_the_schedule_only():
    # A period of 4 (three intra-rack steps at 0.2 s, one crossing at 1.4 s, whose mean
    # is 0.5 s); after two warm-up steps, 7 steps: one whole period and three more
    # intra steps, which would read 0.371 s. Only the whole period counts.
    times = [9.0, 9.0] + [0.2, 0.2, 0.2, 1.4] + [0.2, 0.2, 0.2]
    run = dict(result("dssync", 0.2, CURVE, steps=9), step_times=times, schedule_period=4)
    assert abs(summarize(run, 0.9, "net").mean_step_s - 0.5) < 1e-12
    # Without a period (or with 1) every step after warm-up counts.
    del run["schedule_period"]
    assert abs(summarize(run, 0.9, "net").mean_step_s - 2.6 / 7) < 1e-12


def test_a_run_shorter_than_one_period_takes_every_step_after_warm_up():
    assert abs(mean_step([9.0, 9.0, 0.2, 0.4], period=17) - 0.3) < 1e-12
    assert mean_step([0.5], period=3) == 0.5


def test_the_runner_records_the_rotations_and_the_graphs_period():
    from types import SimpleNamespace

    from hvdx.bench.strategies import STRATEGIES
    from hvdx.core.topology import Topology
    from hvdx.strategies.decentralized.spec import MixingGraph
    from hvdx.strategies.dssync.core_schedule import RotationSchedule

    def rotation(intra_phases):
        schedule = RotationSchedule(Topology.from_counts(2, 2), intra_phases=intra_phases,
                                    cross_ranks=1)
        return SimpleNamespace(hvdx_groups=SimpleNamespace(schedule=schedule))

    period = STRATEGIES["dssync"].period_of
    # Rack groups (one intra digit): intra_phases intra steps, then one crossing.
    assert period(rotation(10)) == 11 and period(rotation(16)) == 17

    def graph(name, n, mix_every=1):
        return SimpleNamespace(hvdx_graph=MixingGraph(name, n, 0),
                               hvdx_strategy=SimpleNamespace(mix_every=mix_every))

    period = STRATEGIES["decentralized"].period_of
    # One-peer exponential graph: distances 1, 2, 4, ... (log2 n of them), then again.
    assert period(graph("one-peer-exp", 4)) == 2 and period(graph("one-peer-exp", 8)) == 3
    assert period(graph("one-peer-exp", 8, mix_every=2)) == 6
    assert period(graph("static-exp", 8)) == 1
    assert STRATEGIES["horovod"].period_of is None and STRATEGIES["topk"].period_of is None


def priced(strategy, mean_s, plan_s, data_ranks=4):
    row = summarize(result(strategy, mean_s, CURVE), 0.9, "net")
    row.predicted_step_s, row.data_ranks = plan_s, data_ranks
    return row


def test_the_verdict_ranks_by_time_per_batch_and_says_when_the_plan_named_another():
    from hvdx.bench.results import fastest_lines

    # Stanza trains 3 batches a step: 90 ms is 30 ms a batch, slower than b's 100 / 4.
    rows = [priced("horovod", 1.0, 1.1), priced("b", 0.100, 0.110),
            priced("stanza", 0.090, 0.090, data_ranks=3)]
    assert fastest_lines(rows) == [
        "w: fastest per batch: b, 25.0 ms per batch (its 100.0 ms mean step over 4 data "
        "ranks), 27.5 ms planned; the plan names it"]
    # The plan prices stanza at 60 ms (20 ms a batch): it names stanza, 20% slower.
    rows[2].predicted_step_s = 0.060
    assert fastest_lines(rows) == [
        "w: fastest per batch: b, 25.0 ms per batch (its 100.0 ms mean step over 4 data "
        "ranks), 27.5 ms planned; the plan names stanza (20.0 ms per batch), which took "
        "20% longer"]
    # At 70 ms (23.3 ms a batch) the plan still names stanza, but with b within 20% of it.
    rows[2].predicted_step_s = 0.070
    assert fastest_lines(rows) == [
        "w: fastest per batch: b, 25.0 ms per batch (its 100.0 ms mean step over 4 data "
        "ranks), 27.5 ms planned; the plan names stanza (23.3 ms per batch), which took "
        "20% longer; the plan had b within its 20% error of it"]
    # Where the plan's steps are mostly compute and within 20% of each other, it names
    # no winner, as hvdx plan does, and says whether the fastest was among them.
    rows[2].predicted_step_s = 0.070
    for row in rows:
        row.predicted_compute_s = row.predicted_step_s * 0.9
    assert fastest_lines(rows) == [
        "w: fastest per batch: b, 25.0 ms per batch (its 100.0 ms mean step over 4 data "
        "ranks); mostly compute, the plan calls it too close to call between stanza, b"]
    rows[1].predicted_step_s = 0.2  # b far behind in the plan: no tie, a winner named
    rows[1].predicted_compute_s = 0.18
    assert fastest_lines(rows)[0].endswith("the plan names stanza (23.3 ms per batch), "
                                           "which took 20% longer")
    # Nothing priced (localhost): no verdict.
    assert fastest_lines([summarize(result("b", 0.1, CURVE), 0.9, "net")]) == []


def test_the_verdict_shows_a_batch_as_the_step_it_divides_by_the_data_ranks():
    from hvdx.bench.results import fastest_lines

    # Stanza's 60 ms step trains 3 batches (3 data ranks): 20 ms a batch, beating b.
    rows = [priced("b", 0.100, 0.110), priced("stanza", 0.060, 0.060, data_ranks=3)]
    line = fastest_lines(rows)[0]
    assert line.startswith("w: fastest per batch: stanza, 20.0 ms per batch (its 60.0 ms "
                           "mean step over 3 data ranks)"), line
    # Without a mean (no schedule to average over), the median step it used is named.
    for row in rows:
        row.mean_step_s = None
    assert "(its 60.0 ms median step over 3 data ranks)" in fastest_lines(rows)[0]
    rows[1].data_ranks, rows[1].median_step_s = 1, 0.010
    assert "(its 10.0 ms median step over 1 data rank)" in fastest_lines(rows)[0]
