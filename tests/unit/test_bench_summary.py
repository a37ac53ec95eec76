"""The benchmark's table: speedups are ratios to the Horovod run of the same workload."""

from hvdx.bench.harness import Summary, _add_speedups, render_table, summarize


def result(strategy, step_s, curve, rx=None, ranks=4, steps=10):
    return {"workload": "w", "strategy": strategy, "ranks": ranks, "steps": steps,
            "step_times": [step_s] * steps, "curve": curve,
            "hvdx_bytes_per_rank_per_step": 1e6,
            "ranks_detail": [{"interface_tx_rx": None if rx is None else [rx, rx]}] * ranks}


CURVE = [{"step": 5, "time": 1.0, "accuracy": 0.5}, {"step": 10, "time": 2.0, "accuracy": 0.95}]


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    row = summarize(result("horovod", 0.2, CURVE), 0.9, "net")
    assert row.time_to_target_s == 2.0 and row.final_accuracy == 0.95


def test_an_unreached_target_has_no_time():
    assert summarize(result("horovod", 0.2, CURVE), 0.99, "net").time_to_target_s is None


def test_interface_bytes_are_per_rank_per_step_and_compared_with_hvdx_count():
    row = summarize(result("horovod", 0.2, CURVE, rx=10.5e6), 0.9, "net")
    assert row.interface_rx_per_step == 1.05e6
    assert abs(row.bytes_agreement - 1.05) < 1e-12


def test_speedups_divide_horovods_times_by_the_strategys():
    rows = [summarize(result("horovod", 0.4, CURVE), 0.9, "net"),
            summarize(result("other", 0.1, [dict(CURVE[1], time=0.5)]), 0.9, "net")]
    _add_speedups(rows)
    assert rows[0].step_speedup == 1.0 and rows[1].step_speedup == 4.0
    assert rows[1].target_speedup == 4.0
    table = render_table(rows)
    assert "net" in table.splitlines()[0] and "4.00" in table
