"""Each priced strategy's local step (every rank on this host) is timed right before its
cluster run, so that both meet the machine in the same state (no MPI job here)."""

from hvdx.bench import harness
from hvdx.bench.harness import FLOOR, LOCAL_STEPS, WARMUP_STEPS
from hvdx.bench.runner import TOPOLOGY_ENV
from hvdx.cluster import ClusterSpec


class FakeCluster:
    hosts = [0, 1, 2, 3]
    closed = False

    def close(self):
        self.closed = True


def fake_bench(monkeypatch, local_fails=()):
    """run_bench with the cluster, the calibration and every MPI job replaced; returns
    the jobs in the order they ran, the raw results and what was said."""
    jobs, said, raw_out, envs = [], [], [], []
    cluster = FakeCluster()
    monkeypatch.setattr(harness, "_start_cluster", lambda spec, say: (cluster, "net"))
    monkeypatch.setattr(harness, "_calibrate", lambda *args: None)
    monkeypatch.setattr(harness, "_add_predictions",
                        lambda rows, raw, spec, calibration: raw_out.extend(raw))
    monkeypatch.setattr(harness, "_write", lambda rows, raw, out_dir: None)

    def run_one(where, workload, strategy, steps, *args, env=None, **kwargs):
        local = where is None
        jobs.append(("local" if local else "cluster", workload, strategy))
        envs.append(env)
        if local and strategy in local_fails:
            raise RuntimeError("local job failed (exit 9):\nboom")
        # Local steps: two slow warm-up steps, then 0.125 s; cluster steps 0.5 s.
        times = ([1.0] * WARMUP_STEPS + [0.125] * (steps - WARMUP_STEPS)) if local \
            else [0.5] * steps
        return {"workload": workload, "strategy": strategy, "ranks": 4, "steps": steps,
                "step_times": times, "curve": [{"step": steps, "time": sum(times),
                                                "accuracy": 0.9}],
                "hvdx_bytes_per_rank_per_step": 0.0,
                "ranks_detail": [{"interface_tx_rx": None}] * 4}

    monkeypatch.setattr(harness, "run_one", run_one)
    fake_bench.envs = envs
    return cluster, jobs, said, raw_out


def test_each_priced_strategy_is_timed_locally_just_before_its_cluster_run(
        monkeypatch, tmp_path):
    cluster, jobs, said, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      say=said.append)
    assert jobs == [("local", "digits_vgg", "horovod"), ("cluster", "digits_vgg", "horovod"),
                    ("cluster", "digits_vgg", FLOOR),  # the floor is not priced
                    ("local", "digits_vgg", "topk"), ("cluster", "digits_vgg", "topk")]
    # The mean step after the warm-up steps of a LOCAL_STEPS-step run.
    assert [r.get("local_step_s") for r in raw] == [0.125, None, 0.125]
    assert f"  digits_vgg / topk: local step 125.0 ms ({LOCAL_STEPS} steps, every rank " \
        "on this host)" in said
    assert cluster.closed


def test_a_strategy_under_two_placements_is_timed_locally_once(monkeypatch, tmp_path):
    _, jobs, _, raw = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["topk"], 6, 3, str(tmp_path),
                      placements=["blocked", "interleaved"], floor=False, say=lambda l: None)
    assert [j[0] + "/" + j[2] for j in jobs] == [
        "local/horovod", "cluster/horovod", "local/topk", "cluster/topk", "cluster/topk"]
    assert [r.get("local_step_s") for r in raw] == [0.125, 0.125, 0.125]


def test_a_failed_local_run_is_said_and_its_plan_falls_back(monkeypatch, tmp_path):
    _, jobs, said, raw = fake_bench(monkeypatch, local_fails=("topk",))
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      floor=False, say=said.append)
    assert ("cluster", "digits_vgg", "topk") in jobs  # the cluster run still happens
    assert [r.get("local_step_s") for r in raw] == [0.125, None]
    assert "  digits_vgg / topk: the local run failed (local job failed (exit 9):); its " \
        "plan takes the floor's step" in said


def test_without_calibration_nothing_runs_locally(monkeypatch, tmp_path):
    _, jobs, _, _ = fake_bench(monkeypatch)
    harness.run_bench(ClusterSpec(), ["digits_vgg"], ["horovod", "topk"], 6, 3, str(tmp_path),
                      floor=False, calibrate=False, say=lambda l: None)
    assert [j[0] for j in jobs] == ["cluster", "cluster"]


def test_the_local_run_stands_in_for_the_cluster_s_topology_and_rates(monkeypatch, tmp_path):
    # So that DS-Sync builds the cluster's rotation (its groups, period and process
    # sets), not one host's.
    _, jobs, _, _ = fake_bench(monkeypatch)
    spec = ClusterSpec(racks=2, hosts_per_rack=3, nic="1gbit", uplink="20mbit")
    harness.run_bench(spec, ["digits_vgg"], ["dssync"], 6, 3, str(tmp_path), floor=False,
                      ranks_per_host=2, say=lambda l: None)
    local = [e for j, e in zip(jobs, fake_bench.envs) if j[0] == "local"]
    assert local == [{TOPOLOGY_ENV: "2x3x2",
                      "HVDX_CLUSTER_LINK_RATES": "1000000000bit,20000000bit"}] * 2
    cluster = [e for j, e in zip(jobs, fake_bench.envs) if j[0] == "cluster"]
    assert cluster == [None, None]
