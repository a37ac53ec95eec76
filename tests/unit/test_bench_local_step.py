"""Each priced strategy's local step (every rank on this host) is timed right before its
cluster run, and, in a full run, right after it too, and so are Horovod's averages
around DS-Sync's and sharded TopK's step around each TopK's, so that both meet the
machine in the same state and a drift in between cancels (no MPI job here)."""

import re

import pytest

from hvdx.bench import (calibration_jobs, harness, local_run, pricing, results,
                        run_list, strategy_run)
from hvdx.bench.local_run import LOCAL_STEPS
from hvdx.bench.summary import FLOOR, WARMUP_STEPS
from hvdx.bench.runner import TOPOLOGY_ENV
from hvdx.cluster import ClusterSpec

pytestmark = [pytest.mark.topk, pytest.mark.dssync]


class FakeCluster:
    hosts = [0, 1, 2, 3]
    closed = False

    def close(self):
        self.closed = True


def _ms(values):
    """Seconds (or lists of them) as whole milliseconds; ``None`` stays."""
    return [None if v is None else [round(x * 1e3) for x in v] if isinstance(v, list)
            else round(v * 1e3) for v in values]


def fake_bench(monkeypatch, local_fails=(), calibration=None, set_averages=(),
               sharded=(), local_waits=None):
    """run_bench with the cluster, the calibration and every MPI job replaced; returns
    the jobs in the order they ran, the raw results and what was said. The timings of
    Horovod's averages come from ``set_averages`` in turn, those of sharded TopK's
    step from ``sharded``; ``local_waits`` (the local runs in turn) gives each rank's
    wait in hvdx's exchanges after the warm-up steps (else the runs record none)."""
    local_waits = iter(local_waits or ())
    jobs, said, raw_out, envs = [], [], [], []
    cluster = FakeCluster()
    monkeypatch.setattr(strategy_run, "start_cluster", lambda spec, say: (cluster, "net"))
    monkeypatch.setattr(calibration_jobs, "calibrate", lambda *args: calibration)
    timings, sharded_timings = iter(set_averages), iter(sharded)

    def set_averages_again(*args):
        jobs.append(("set averages", None, None))
        fake_bench.set_average_args.append(args[5:])
        return next(timings)

    def sharded_topk_again(*args):
        jobs.append(("sharded topk", None, None))
        fake_bench.sharded_args.append(args[5:])
        return next(sharded_timings)

    monkeypatch.setattr(calibration_jobs, "set_averages_again", set_averages_again)
    monkeypatch.setattr(calibration_jobs, "sharded_topk_again", sharded_topk_again)
    monkeypatch.setattr(local_run, "usable_cores", lambda: 2)
    monkeypatch.setattr(pricing, "add_predictions",
                        lambda rows, raw, spec, calibration: raw_out.extend(raw))
    monkeypatch.setattr(results, "write", lambda rows, raw, out_dir: None)

    def run_one(where, workload, strategy, steps, *args, env=None, **kwargs):
        local = where is None
        jobs.append(("local" if local else "cluster", workload, strategy))
        envs.append(env)
        if local and (strategy in local_fails or
                      (strategy, len([j for j in jobs if j[2] == strategy])) in local_fails):
            raise RuntimeError("local job failed (exit 9):\nboom")
        # Local steps: two slow warm-up steps, then 0.1 s before the cluster run and
        # 0.15 s after it (the machine slowed down); cluster steps 0.5 s.
        local_step = 0.1 if len([j for j in jobs if j[2] == strategy]) == 1 else 0.15
        times = ([1.0] * WARMUP_STEPS + [local_step] * (steps - WARMUP_STEPS)) if local \
            else [0.5] * steps
        detail = [{"interface_tx_rx": None} for _ in range(4)]
        waits = next(local_waits, None) if local else None
        for rank, wait in enumerate(waits or ()):
            # The warm-up steps wait long (connections are set up): left out.
            detail[rank]["step_waits"] = [0.9] * WARMUP_STEPS + \
                [wait] * (steps - WARMUP_STEPS)
        return {"workload": workload, "strategy": strategy, "ranks": 4, "steps": steps,
                "step_times": times, "curve": [{"step": steps, "time": sum(times),
                                                "quality": 0.9}],
                "hvdx_bytes_per_rank_per_step": 0.0, "ranks_detail": detail}

    monkeypatch.setattr(strategy_run, "run_one", run_one)
    fake_bench.envs = envs
    fake_bench.set_average_args = []
    fake_bench.sharded_args = []
    return cluster, jobs, said, raw_out


def test_the_quick_run_times_each_priced_strategy_locally_once_and_nothing_again(
        monkeypatch, tmp_path):
    cluster, jobs, said, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "dssync", "topk"], 6, 3,
                      str(tmp_path), say=said.append)
    assert jobs == [("local", "digits_vgg", "horovod"), ("cluster", "digits_vgg", "horovod"),
                    ("cluster", "digits_vgg", FLOOR),
                    ("local", "digits_vgg", "dssync"), ("cluster", "digits_vgg", "dssync"),
                    ("local", "digits_vgg", "topk"), ("cluster", "digits_vgg", "topk")]
    assert fake_bench.set_average_args == [] and fake_bench.sharded_args == []
    # Each turn says where the run stands and what is left; the end says how long.
    turns = [line for line in said if line.startswith("[")]
    assert len(turns) == 4 and all(re.match(r"\[\d/4, \d+ s in, about \d+ (s|min) left\] ",
                                            line) for line in turns)
    assert said[-1].startswith("done in ")


def test_presets_with_one_setting_under_adamw_run_once_and_the_other_row_says_so(
        monkeypatch, tmp_path):
    # lm trains with AdamW, under which both presets send 20% both ways (one setting);
    # digits_vgg trains with SGD, under which their downlinks differ (1% and 2%).
    cluster, jobs, said, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["lm", "digits_vgg"], ["horovod", "fast", "safe"], 6, 3,
                      str(tmp_path), say=said.append, floor=False, calibrate=False)
    assert [(w, s) for kind, w, s in jobs] == [
        ("lm", "horovod"), ("lm", "fast"),
        ("digits_vgg", "horovod"), ("digits_vgg", "fast"), ("digits_vgg", "safe")]
    assert any("the settings of fast here, run once" in line for line in said)
    lines = run_list.not_applicable(["lm", "digits_vgg"], ["horovod", "fast", "safe"])
    assert len(lines) == 1 and lines[0].startswith("lm: safe is not run: its settings "
                                                   "there are fast's (topk ratio=0.2 "
                                                   "downlink=0.2 ")


def test_each_priced_strategy_is_timed_locally_just_before_and_after_its_cluster_run(
        monkeypatch, tmp_path):
    cluster, jobs, said, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      say=said.append, full=True)
    assert jobs == [("local", "digits_vgg", "horovod"), ("cluster", "digits_vgg", "horovod"),
                    ("local", "digits_vgg", "horovod"),
                    ("cluster", "digits_vgg", FLOOR),  # the floor is not priced
                    ("local", "digits_vgg", "topk"), ("cluster", "digits_vgg", "topk"),
                    ("local", "digits_vgg", "topk")]
    # Each the mean step after the warm-up steps of a LOCAL_STEPS-step run; the plan
    # takes the mean of the two.
    assert _ms(r.get("local_steps_s") for r in raw) == [[100, 150], None, [100, 150]]
    assert _ms(r.get("local_step_s") for r in raw) == [125, None, 125]
    assert f"  digits_vgg / topk: local step 100.0 ms ({LOCAL_STEPS} steps, every rank " \
        "on this host)" in said
    assert f"  digits_vgg / topk: local step 150.0 ms ({LOCAL_STEPS} steps, every rank " \
        "on this host)" in said
    assert cluster.closed


def test_a_strategy_under_two_placements_is_timed_locally_around_its_first_run(
        monkeypatch, tmp_path):
    _, jobs, _, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      placements=["blocked", "interleaved"], floor=False, say=lambda l: None, full=True)
    assert [j[0] + "/" + j[2] for j in jobs] == [
        "local/horovod", "cluster/horovod", "local/horovod",
        "local/topk", "cluster/topk", "local/topk", "cluster/topk"]
    assert _ms(r.get("local_step_s") for r in raw) == [125, 125, 125]


def test_a_failed_local_run_is_said_and_its_plan_falls_back(monkeypatch, tmp_path):
    _, jobs, said, raw = fake_bench(monkeypatch, local_fails=("topk",))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      floor=False, say=said.append, full=True)
    assert ("cluster", "digits_vgg", "topk") in jobs  # the cluster run still happens
    assert _ms(r.get("local_step_s") for r in raw) == [125, None]
    assert "  digits_vgg / topk: the local run failed (local job failed (exit 9):); its " \
        "plan takes the floor's step" in said


def test_a_failed_local_run_after_the_cluster_run_leaves_the_one_before(
        monkeypatch, tmp_path):
    # topk's third job is its local run after the cluster run.
    _, jobs, _, raw = fake_bench(monkeypatch, local_fails=(("topk", 3),))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      floor=False, say=lambda l: None, full=True)
    assert _ms(r.get("local_steps_s") for r in raw) == [[100, 150], [100]]
    assert _ms(r.get("local_step_s") for r in raw) == [125, 100]


def test_without_calibration_nothing_runs_locally(monkeypatch, tmp_path):
    _, jobs, _, _ = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      floor=False, calibrate=False, say=lambda l: None, full=True)
    assert [j[0] for j in jobs] == ["cluster", "cluster"]


def test_the_local_run_stands_in_for_the_cluster_s_topology_and_rates(monkeypatch, tmp_path):
    # So that DS-Sync builds the cluster's rotation (its groups, period and process
    # sets), not one host's.
    _, jobs, _, _ = fake_bench(monkeypatch)
    spec = ClusterSpec(racks=2, hosts_per_rack=3, nic="1gbit", uplink="20mbit")
    harness.run_bench(spec, ["digits_vgg"], ["dssync"], 6, 3, str(tmp_path), floor=False,
                      ranks_per_host=2, say=lambda l: None, full=True)
    local = [e for j, e in zip(jobs, fake_bench.envs) if j[0] == "local"]
    assert local == [{TOPOLOGY_ENV: "2x3x2",
                      "HVDX_CLUSTER_LINK_RATES": "1000000000bit,20000000bit"}] * 4
    cluster = [e for j, e in zip(jobs, fake_bench.envs) if j[0] == "cluster"]
    assert cluster == [None, None]


def test_dssyncs_averages_are_timed_again_around_its_run_and_the_plan_takes_their_mean(
        monkeypatch, tmp_path):
    from hvdx.core.calibration import Calibration

    calibration = Calibration(tables={"nic": {1: [(0, 0.001)]}},
                              set_allreduce_times={"rack": [(1e6, 0.5)]})
    _, jobs, _, raw = fake_bench(monkeypatch, calibration=calibration, set_averages=(
        {"rack": [[1e3, 0.01], [1e6, 0.1]]}, {"rack": [[1e6, 0.3]]}))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "dssync"], 6, 3,
                      str(tmp_path), floor=False, say=lambda l: None, full=True)
    assert [j[0] + ("/" + j[2] if j[2] else "") for j in jobs] == [
        "local/horovod", "cluster/horovod", "local/horovod",  # Horovod's own: not again
        "local/dssync", "set averages", "cluster/dssync", "set averages", "local/dssync"]
    # The mean of the two timings, for the sizes both timed.
    assert raw[1]["set_allreduce_times"] == {"rack": [[1e6, pytest.approx(0.2)]]}
    assert "set_allreduce_times" not in raw[0]


def test_the_averages_around_dssyncs_run_are_timed_at_the_models_own_size(
        monkeypatch, tmp_path):
    # digits_vgg has 1,370,634 float32 parameters, the bytes DS-Sync averages.
    from hvdx.core.calibration import Calibration

    calibration = Calibration(tables={"nic": {1: [(0, 0.001)]}},
                              set_allreduce_times={"rack": [(1e6, 0.5)]})
    fake_bench(monkeypatch, calibration=calibration,
               set_averages=({"rack": [[1e6, 0.1]]}, {"rack": [[1e6, 0.3]]}))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["dssync"], 6, 3, str(tmp_path),
                      floor=False, say=lambda l: None, full=True)
    assert fake_bench.set_average_args == [(4 * 1_370_634,)] * 2


def test_a_failed_timing_of_the_averages_leaves_the_other_and_two_leave_the_calibration(
        monkeypatch, tmp_path):
    from hvdx.core.calibration import Calibration

    calibration = Calibration(tables={"nic": {1: [(0, 0.001)]}},
                              set_allreduce_times={"rack": [(1e6, 0.5)]})
    for timings, expected in (((None, {"rack": [[1e6, 0.3]]}), {"rack": [[1e6, 0.3]]}),
                              ((None, None), None)):
        _, _, _, raw = fake_bench(monkeypatch, calibration=calibration,
                                  set_averages=timings)
        harness.run_bench(ClusterSpec(), ["digits_vgg"], ["dssync"], 6, 3, str(tmp_path),
                          floor=False, say=lambda l: None, full=True)
        assert raw[-1].get("set_allreduce_times") == expected


def test_the_plan_of_a_run_takes_the_averages_timed_around_it():
    from hvdx.bench.pricing import add_predictions
    from hvdx.bench.summary import summarize
    from hvdx.core.calibration import Calibration

    spec = ClusterSpec(racks=2, hosts_per_rack=2, nic="1gbit", uplink="100mbit")
    tables = {"uplink": {1: [(0, 0.01), (1e7, 0.9)]}, "nic": {1: [(0, 0.001), (1e7, 0.09)]}}
    run = {"workload": "digits_vgg", "strategy": "dssync", "ranks": 4, "steps": 10,
           "step_times": [0.2] * 10, "curve": [{"step": 10, "time": 2.0, "quality": 0.96}],
           "hvdx_bytes_per_rank_per_step": 5e6, "ranks_detail": [{"interface_tx_rx": None}] * 4,
           "parameter_split": (55_000, 1_350_000), "parameters": 1_405_000,
           "compute_s": 0.05, "local_step_s": 0.08,
           "cost_options": {"intra_phases": 10, "cross_ranks": 1}}
    plans = []
    for rack_average_s in (0.1, 0.3):
        calibration = Calibration(tables=tables,
                                  set_allreduce_times={"rack": [(1e3, 0.01), (1e7, 0.5)]})
        retimed = dict(run, set_allreduce_times={"rack": [[0, rack_average_s],
                                                          [1e7, rack_average_s]]})
        rows = [summarize(retimed, 0.95, "net")]
        add_predictions(rows, [retimed], spec, calibration)
        plans.append(rows[0].predicted_step_s)
    # Ten of every eleven steps average on the racks: 10/11 of the 0.2 s between them.
    assert plans[1] - plans[0] == pytest.approx(10 / 11 * 0.2)


# digits_vgg has 1,370,634 parameters: TopK at 1% sends ceil(13,706.34) = 13,707 pairs
# of 8 bytes up; the "safe" preset's downlink of 2% ceil(27,412.68) = 27,413 pairs.
DIGITS_UP = 13_707 * 8
TWO_RACKS = ClusterSpec(racks=2, hosts_per_rack=2, nic="1gbit", uplink="100mbit")
#: A fast run on TWO_RACKS whose local step took 80 ms.
TOPK_DGC_RUN = {
    "workload": "digits_vgg", "strategy": "fast", "ranks": 4, "steps": 10,
    "step_times": [0.2] * 10, "curve": [{"step": 10, "time": 2.0, "quality": 0.96}],
    "hvdx_bytes_per_rank_per_step": 1e5, "ranks_detail": [{"interface_tx_rx": None}] * 4,
    "parameter_split": (55_000, 1_315_634), "parameters": 1_370_634,
    "compute_s": 0.05, "local_step_s": 0.08}
TABLES = {"uplink": {1: [(0, 0.01), (1e7, 0.9)]}, "nic": {1: [(0, 0.001), (1e7, 0.09)]}}


def test_sharded_topks_step_is_timed_again_around_each_topk_run_at_its_own_size(
        monkeypatch, tmp_path):
    from hvdx.core.calibration import Calibration

    calibration = Calibration(tables={"nic": {1: [(0, 0.001)]}},
                              sharded_topk_times={1: [(1e5, 0.5)], 2: [(1e5, 0.6)]})
    dgc, masked = repr(1.0), repr(27_413 / 13_707)
    _, jobs, _, raw = fake_bench(monkeypatch, calibration=calibration, sharded=(
        {dgc: [[DIGITS_UP, 0.1]]}, {dgc: [[DIGITS_UP, 0.2]]},
        {masked: [[DIGITS_UP, 0.3]]}, {masked: [[DIGITS_UP, 0.5]]}))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "fast", "safe"],
                      6, 3, str(tmp_path), floor=False, say=lambda l: None, full=True)
    assert [j[0] + ("/" + j[2] if j[2] else "") for j in jobs] == [
        "local/horovod", "cluster/horovod", "local/horovod",  # Horovod's own: not again
        "local/fast", "sharded topk", "cluster/fast", "sharded topk",
        "local/fast",
        "local/safe", "sharded topk", "cluster/safe", "sharded topk",
        "local/safe"]
    assert fake_bench.sharded_args == [(DIGITS_UP, 1.0)] * 2 + \
        [(DIGITS_UP, pytest.approx(27_413 / 13_707))] * 2
    # The mean of the two timings.
    assert raw[1]["sharded_topk_times"] == {dgc: [[DIGITS_UP, pytest.approx(0.15)]]}
    assert raw[2]["sharded_topk_times"] == {masked: [[DIGITS_UP, pytest.approx(0.4)]]}
    assert "sharded_topk_times" not in raw[0]


def test_without_a_timed_sharded_step_topk_runs_without_timing_it_again(
        monkeypatch, tmp_path):
    from hvdx.core.calibration import Calibration

    calibration = Calibration(tables={"nic": {1: [(0, 0.001)]}})
    _, jobs, _, raw = fake_bench(monkeypatch, calibration=calibration)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      floor=False, say=lambda l: None, full=True)
    assert "sharded topk" not in [j[0] for j in jobs]
    assert "sharded_topk_times" not in raw[0]


def test_the_plan_of_a_topk_run_takes_the_sharded_step_timed_around_it():
    from hvdx.bench.pricing import add_predictions
    from hvdx.bench.summary import summarize
    from hvdx.core.calibration import Calibration

    spec, run = TWO_RACKS, dict(TOPK_DGC_RUN)
    calibration = Calibration(tables=TABLES,
                              sharded_topk_times={1: [(1e3, 0.01), (1e6, 0.5)]})
    plans = []
    for step_s in (0.1, 0.25):
        retimed = dict(run, sharded_topk_times={repr(1.0): [[DIGITS_UP, step_s]]})
        rows = [summarize(retimed, 0.95, "net")]
        add_predictions(rows, [retimed], spec, calibration)
        plans.append(rows[0].predicted_step_s)
    # The local step, then the sharded step as timed at the run's own size.
    assert plans == [pytest.approx(0.08 + 0.1), pytest.approx(0.08 + 0.25)]


def test_timing_again_runs_the_jobs_mode_on_the_benchs_calibration(monkeypatch, tmp_path):
    from hvdx.core.calibration import Calibration

    jobs = []

    def calibration_job(cluster, ranks_per_host, path, options, timeout, say):
        jobs.append((path, options))
        return Calibration(tables={"nic": {1: [(0, 0.001)]}},
                           sharded_topk_times={1.5: [(2048, 0.25)]},
                           set_allreduce_times={"rack": [(1e6, 0.5)]})

    monkeypatch.setattr(calibration_jobs, "calibration_job", calibration_job)
    base = str(tmp_path / "calibration.json")
    assert calibration_jobs.sharded_topk_again(None, 1, str(tmp_path), 900, None, 2048, 1.5) == \
        {"1.5": [[2048, 0.25]]}
    assert calibration_jobs.set_averages_again(None, 1, str(tmp_path), 900, None, 4000) == \
        {"rack": [[1e6, 0.5]]}
    assert jobs == [
        (str(tmp_path / "sharded_topk.json"), ["--sharded-topk-of", base,
                                               "--sharded-topk-bytes", "2048",
                                               "--downlink-multiple", "1.5"]),
        (str(tmp_path / "set_averages.json"), ["--set-averages-of", base,
                                               "--set-average-bytes", "4000"])]


def test_the_local_runs_record_the_least_wait_of_any_rank_and_the_plan_takes_their_mean(
        monkeypatch, tmp_path):
    # Before the cluster run the ranks waited 30, 20, 40 and 50 ms a step in hvdx's
    # exchanges, after it 40, 45, 60 and 70 ms: the rank waiting least sets how much
    # wire the step can hold.
    # (Horovod's two local runs come first, and its ranks wait in no hvdx exchange.)
    _, _, said, raw = fake_bench(monkeypatch, local_waits=(
        None, None, (0.03, 0.02, 0.04, 0.05), (0.04, 0.045, 0.06, 0.07)))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      floor=False, say=said.append, full=True)
    assert [r["strategy"] for r in raw] == ["horovod", "topk"]
    assert "local_wait_s" not in raw[0]
    assert _ms(raw[1]["local_waits_s"]) == [20, 40]
    assert raw[1]["local_wait_s"] == pytest.approx(0.03)
    assert raw[1]["local_cores"] == 2  # the four ranks shared this machine's two cores
    assert f"  digits_vgg / topk: local step 100.0 ms, 20.0 ms of it waiting in hvdx's " \
        f"exchanges ({LOCAL_STEPS} steps, every rank on this host)" in said


def test_a_local_run_without_waits_leaves_the_plan_without_one(monkeypatch, tmp_path):
    # Horovod's own collectives wait in its background thread, not in hvdx's waits; and
    # a run that recorded no waits (an older runner) gives none, not zero.
    _, _, _, raw = fake_bench(monkeypatch, local_waits=(None, None, (0.03,) * 4, None))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      floor=False, say=lambda l: None, full=True)
    assert raw[1]["strategy"] == "topk" and raw[1]["local_step_s"] == pytest.approx(0.125)
    assert "local_wait_s" not in raw[1] and "local_waits_s" not in raw[1]


def test_the_local_wait_is_the_least_ranks_mean_over_the_counted_steps():
    from hvdx.bench.summary import local_wait

    warm = [5.0] * WARMUP_STEPS
    result = {"schedule_period": 2, "ranks_detail": [
        {"step_waits": warm + [0.01, 0.03, 0.01, 0.03, 9.0]},  # a cut period: left out
        {"step_waits": warm + [0.04, 0.04, 0.02, 0.02, 0.0]}]}
    assert local_wait(result) == pytest.approx(0.02)
    result["ranks_detail"].append({})
    assert local_wait(result) is None


def test_a_runs_row_carries_its_wait_for_hvdx_plan():
    from hvdx.bench.summary import summarize

    run = {"workload": "digits_vgg", "strategy": "topk", "ranks": 2, "steps": 4,
           "step_times": [0.2] * 4, "curve": [{"step": 4, "time": 0.8, "quality": 0.9}],
           "hvdx_bytes_per_rank_per_step": 1e5,
           "ranks_detail": [{"interface_tx_rx": None, "step_waits": [1.0, 1.0, 0.05, 0.07]},
                            {"interface_tx_rx": None, "step_waits": [1.0, 1.0, 0.03, 0.03]}]}
    assert summarize(run, 0.95, "localhost").hvdx_wait_s == pytest.approx(0.03)
    del run["ranks_detail"][0]["step_waits"]
    assert summarize(run, 0.95, "localhost").hvdx_wait_s is None


def test_the_plan_adds_the_wire_beyond_what_the_earlier_waves_send_during_the_wait():
    from hvdx.bench.pricing import add_predictions
    from hvdx.bench.summary import summarize
    from hvdx.core.calibration import Calibration

    spec = TWO_RACKS
    run = dict(TOPK_DGC_RUN, sharded_topk_times={repr(1.0): [[DIGITS_UP, 0.1]]})
    calibration = Calibration(tables=TABLES)
    plans = []
    for wait_s, cores in ((None, None), (0.0, 2), (0.03, 2), (0.07, 2), (0.07, 1),
                          (0.07, 4)):
        priced = run if wait_s is None else dict(run, local_wait_s=wait_s, local_cores=cores)
        rows = [summarize(priced, 0.95, "net")]
        add_predictions(rows, [priced], spec, calibration)
        plans.append(rows[0].predicted_step_s)
    # 80 ms of local step and 100 ms of sharded step. Four ranks on two cores: the
    # first wave's half of the wire (50 ms) runs in the wait, as far as the wait goes;
    # on one core three quarters (75 ms); with a core per rank, none.
    assert plans == [pytest.approx(0.18), pytest.approx(0.18), pytest.approx(0.15),
                     pytest.approx(0.13), pytest.approx(0.11), pytest.approx(0.18)]
