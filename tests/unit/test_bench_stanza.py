"""Stanza in the benchmark: its strategies, byte count, split of the workloads and the
prediction of its step (no MPI job here)."""

import types

import pytest
import torch

from hvdx.bench.pricing import add_predictions
from hvdx.bench.summary import summarize
from hvdx.bench.strategies import DEFAULT_STRATEGIES, STRATEGIES
from hvdx.strategies.stanza.bench_rows import stanza_bytes
from hvdx.bench.workloads import WORKLOADS
from hvdx.cluster import ClusterSpec
from hvdx.core.cost_model import Prediction
from hvdx.strategies.stanza.core_roles import stanza_roles
from hvdx.strategies.stanza.mpi_exchange import StanzaStats

pytestmark = [pytest.mark.stanza]


def test_a_plain_bench_runs_stanza_with_one_fc_worker_and_its_variants_when_named():
    assert "stanza" in DEFAULT_STRATEGIES
    for name in ("stanza_f2", "stanza_auto", "stanza_micro"):
        assert name not in DEFAULT_STRATEGIES
    for name in ("stanza", "stanza_f2", "stanza_auto", "stanza_micro"):
        strategy = STRATEGIES[name]
        assert strategy.roles and strategy.cost_model == "stanza"
        # Horovod's defaults, as the baseline's.
        assert strategy.env == {}
    assert not any(s.roles for n, s in STRATEGIES.items() if not n.startswith("stanza"))


def test_the_bytes_per_step_are_the_steps_traffic_at_the_allreduces_cost_without_setup():
    stats = StanzaStats()
    stats.record("setup", sent=10**9, received=10**9)  # the broadcast, full_model
    for _ in range(4):
        stats.record("activations", sent=4096 + 256)
        stats.record("activation_gradients", received=4096)
        stats.record("conv_allreduce", sent=1000, received=1000)
        stats.record("control", received=8)
    # Three conv workers: their allreduce of 1000 bytes moves 2 * 2/3 * 1000 each way.
    trainer = types.SimpleNamespace(stats=stats, roles=stanza_roles(4, 1))
    sent, received = stanza_bytes(trainer, None, 4, steps=4)
    assert sent == pytest.approx(4096 + 256 + 4000 / 3)
    assert received == pytest.approx(4096 + 4000 / 3 + 8)


@pytest.mark.parametrize("workload", sorted(w for w in WORKLOADS
                                             if "stanza" not in WORKLOADS[w].does_not_apply))
def test_each_workload_splits_into_features_and_a_head_that_make_the_model(workload):
    model = WORKLOADS[workload].make_model().eval()
    features, head = model.stanza_parts()
    x = torch.rand(3, 1, *{"resnet": (28, 28)}.get(workload, (8, 8)))
    torch.testing.assert_close(head(features(x)), model(x), rtol=0, atol=0)
    # The parts hold the model's own parameters, so an optimizer over the model trains them.
    mine = {id(p) for p in model.parameters()}
    assert {id(p) for p in features.parameters()} | {id(p) for p in head.parameters()} == mine
    assert all(isinstance(m, torch.nn.Linear) for m in head.modules()
               if any(True for _ in m.parameters(recurse=False)))


def stanza_run(strategy, fc_workers):
    """A runner result of Stanza on digits_vgg, as the harness reads it."""
    return {"workload": "digits_vgg", "strategy": strategy, "ranks": 4, "steps": 10,
            "step_times": [0.2] * 10, "curve": [{"step": 10, "time": 2.0, "quality": 0.96}],
            "hvdx_bytes_per_rank_per_step": 3e5,
            "ranks_detail": [{"interface_tx_rx": None}] * 4,
            "parameter_split": (55_000, 1_350_000), "parameters": 1_405_000,
            "compute_s": 0.05, "cost_options": {"fc_workers": fc_workers},
            "stanza": {"activation_size": 1024, "fc_compute_fraction": 0.3}}


class RecordedPredict:
    """Stands in for the cost model's ``predict``: records what the harness asks it and
    answers a step of its own, so the test checks the harness's wiring, not the model."""

    def __init__(self, step_s=0.123):
        self.calls, self.step_s = [], step_s

    def __call__(self, strategy, cluster, workload, local_step_s=None, local_wait_s=None,
                 local_cores=None, **options):
        self.calls.append(dict(strategy=strategy, cluster=cluster, workload=workload,
                               local_step_s=local_step_s, options=options))
        return Prediction(strategy, strategy, self.step_s, 0.0, 0.0, "none", (), 3)


@pytest.fixture
def recorded(monkeypatch):
    import hvdx.core.cost_model

    fake = RecordedPredict()
    monkeypatch.setattr(hvdx.core.cost_model, "predict", fake)
    return fake


def test_the_prediction_uses_the_layout_the_run_used_and_the_measured_split(recorded):
    spec = ClusterSpec(racks=2, hosts_per_rack=2, nic="1gbit", uplink="100mbit")
    run = stanza_run("stanza_auto", 2)
    rows = [summarize(run, 0.95, "net")]
    add_predictions(rows, [run], spec)
    (call,) = recorded.calls
    assert call["strategy"] == "stanza" and call["options"] == {"fc_workers": 2}
    c, w = call["cluster"], call["workload"]
    assert (c.racks, c.hosts_per_rack, c.nic_bps, c.uplink_bps) == (2, 2, 1e9, 1e8)
    assert (w.conv_params, w.fc_params, w.compute_s, w.batch_size) == (55_000, 1_350_000,
                                                                        0.05, 32)
    assert (w.activation_size, w.fc_compute_fraction) == (1024, 0.3)
    assert rows[0].predicted_step_s == 0.123


def test_a_calibrated_prediction_prices_the_runs_local_step_on_the_calibrated_links(
        recorded):
    from hvdx.core.calibration import Calibration

    spec = ClusterSpec(racks=2, hosts_per_rack=2, nic="1gbit", uplink="100mbit")
    calibration = Calibration(tables={"uplink": {1: [(0, 0.01), (1e6, 0.09)]},
                                      "nic": {1: [(0, 0.001), (1e6, 0.009)]}})
    run = stanza_run("stanza", 1)
    local = dict(run, local_step_s=0.04)
    rows = [summarize(run, 0.95, "net"), summarize(local, 0.95, "net")]
    add_predictions(rows, [run, local], spec, calibration)
    # Per run: first on the configured rates, then on the calibrated links.
    plain, calibrated, plain_local, calibrated_local = recorded.calls
    assert plain["cluster"].calibration is None and plain["local_step_s"] is None
    assert calibrated["cluster"].calibration is not None
    assert calibrated["local_step_s"] is None  # no local run: the modelled compute
    assert plain_local["local_step_s"] is None
    assert calibrated_local["local_step_s"] == 0.04
    assert rows[1].uncalibrated_step_s == rows[0].uncalibrated_step_s == 0.123
