"""`hvdx bench` on the emulated cluster: hvdx's byte count matches the interfaces.

The runs skip the calibration job (`--no-calibrate`: a minute per run at 100 Mbit, more
than the suite can spend three times); the job itself runs in the MPI tests
(tests/mpi/torch/test_calibration_job.py), and the plan column from the configured rates
is still checked here."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root")


def test_horovod_and_stanza_bytes_match_the_interface_counters_within_10_percent(tmp_path):
    # Stanza's ranks have roles (the runner drives its trainer, evaluates the model rebuilt
    # on rank 0): its count, without the evaluations' transfers, matches the interfaces.
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "hvdx.cli", "bench", "--workloads", "digits_vgg",
         "--strategies", "horovod,stanza", "--steps", "6", "--eval-every", "3",
         "--no-calibrate", "--out", str(out)],
        capture_output=True, text=True, timeout=400,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "emulated 2x2, NIC 1gbit, uplink 100mbit" in proc.stdout
    assert "step 6/6" in proc.stdout  # progress was shown
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert [row["strategy"] for row in summary] == ["horovod", "floor", "stanza"]
    horovod, floor, stanza = summary
    for row in (horovod, stanza):
        assert abs(row["bytes_agreement"] - 1.0) <= 0.10, row
        assert row["prediction_error"] is not None
        assert row["floor_multiple"] > 1.0  # communication costs something
    # The floor trains alone: nothing of hvdx's, next to nothing on the interfaces.
    assert floor["hvdx_bytes_per_step"] == 0 and floor["floor_multiple"] == 1.0
    assert floor["interface_rx_per_step"] < 0.01 * horovod["interface_rx_per_step"]
    # One FC worker: far fewer bytes than the allreduce of the whole model.
    assert stanza["hvdx_bytes_per_step"] < 0.1 * horovod["hvdx_bytes_per_step"]
    for name in ("results.csv", "results.png"):
        assert (out / name).stat().st_size > 0


def test_an_invalid_rate_is_refused_before_anything_is_created():
    proc = subprocess.run([sys.executable, "-m", "hvdx.cli", "bench", "--uplink", "fast"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "uplink='fast'" in proc.stderr


def test_contention_events_are_replayed_for_each_run_from_its_launch(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "hvdx.cli", "bench", "--workloads", "digits_cnn",
         "--strategies", "horovod", "--steps", "4", "--eval-every", "2",
         "--contention", "uplink=20mbit@0", "--no-floor", "--no-calibrate", "--out",
         str(out)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads((out / "results.json").read_text())["runs"][0]
    assert [change[1:] for change in run["contention"]] == [["uplink", 20_000_000]]


def test_decentralized_bytes_match_the_interfaces_under_both_placements(tmp_path):
    # 2 x 2 hosts, one-peer exponential graph: one model sent and one received per rank
    # per step by hvdx's count, against the interfaces' counters; Horovod runs once
    # (blocked), the graph under each placement.
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "hvdx.bench.cli", "--workloads", "digits_vgg",
         "--strategies", "horovod,decentralized", "--placement", "blocked,interleaved",
         "--steps", "6", "--eval-every", "3", "--no-floor", "--no-calibrate", "--out",
         str(out)],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((out / "results.json").read_text())
    summary = data["summary"]
    assert [(r["strategy"], r["placement"]) for r in summary] == [
        ("horovod", "blocked"), ("decentralized", "blocked"),
        ("decentralized", "interleaved")]
    model_bytes = 4 * data["runs"][0]["parameters"]
    for row, run in zip(summary[1:], data["runs"][1:]):
        # Parameters and BatchNorm statistics, one model per step each way.
        assert row["hvdx_bytes_per_step"] == pytest.approx(model_bytes, rel=0.01)
        assert row["hvdx_received_per_step"] == row["hvdx_bytes_per_step"]
        assert abs(row["bytes_agreement"] - 1.0) <= 0.10, row
        assert row["prediction_error"] is not None
        assert run["final_stats"]["consensus_distance"] >= 0
    assert "decentralized@interleaved" in proc.stdout
