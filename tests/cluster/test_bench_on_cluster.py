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

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="the emulated cluster needs root"),
              pytest.mark.decentralized, pytest.mark.stanza]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One `hvdx bench` on the default 2 x 2 cluster serves every test of the module (the
    suite's time is shared): Horovod and the floor under the blocked placement, Stanza and
    the exponential graph under both, and a contention event replayed for each run (a
    90 Mbit uplink from the launch: the event, not its effect, is what is checked)."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "hvdx.cli", "bench", "--workloads", "digits_vgg",
         "--strategies", "horovod,stanza,decentralized", "--placement",
         "blocked,interleaved", "--steps", "6", "--eval-every", "3",
         "--contention", "uplink=90mbit@0", "--no-calibrate", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, out, json.loads((out / "results.json").read_text())


def test_the_runs_are_the_strategies_under_each_placement_with_progress(bench):
    proc, out, data = bench
    assert "emulated 2x2, NIC 1gbit, uplink 100mbit" in proc.stdout
    assert "step 6/6" in proc.stdout  # progress was shown
    assert "decentralized@interleaved" in proc.stdout
    assert [(r["strategy"], r["placement"]) for r in data["summary"]] == [
        ("horovod", "blocked"), ("floor", "blocked"), ("stanza", "blocked"),
        ("decentralized", "blocked"), ("stanza", "interleaved"),
        ("decentralized", "interleaved")]
    for name in ("results.csv", "results.png"):
        assert (out / name).stat().st_size > 0


def test_horovod_and_stanza_bytes_match_the_interface_counters_within_10_percent(bench):
    # Stanza's ranks have roles (the runner drives its trainer, evaluates the model rebuilt
    # on rank 0): its count, without the evaluations' transfers, matches the interfaces.
    summary = {(r["strategy"], r["placement"]): r for r in bench[2]["summary"]}
    horovod, floor = summary["horovod", "blocked"], summary["floor", "blocked"]
    for stanza in (summary["stanza", "blocked"], summary["stanza", "interleaved"]):
        for row in (horovod, stanza):
            assert abs(row["bytes_agreement"] - 1.0) <= 0.10, row
            assert row["prediction_error"] is not None
            assert row["floor_multiple"] > 1.0  # communication costs something
        # One FC worker: far fewer bytes than the allreduce of the whole model.
        assert stanza["hvdx_bytes_per_step"] < 0.1 * horovod["hvdx_bytes_per_step"]
    # The floor trains alone: nothing of hvdx's, next to nothing on the interfaces.
    assert floor["hvdx_bytes_per_step"] == 0 and floor["floor_multiple"] == 1.0
    assert floor["interface_rx_per_step"] < 0.01 * horovod["interface_rx_per_step"]


def test_decentralized_bytes_match_the_interfaces_under_both_placements(bench):
    # One-peer exponential graph: one model sent and one received per rank per step by
    # hvdx's count, against the interfaces' counters, under each placement.
    data = bench[2]
    model_bytes = 4 * data["runs"][0]["parameters"]
    graph = [(row, run) for row, run in zip(data["summary"], data["runs"])
             if row["strategy"] == "decentralized"]
    assert [row["placement"] for row, _ in graph] == ["blocked", "interleaved"]
    for row, run in graph:
        # Parameters and BatchNorm statistics, one model per step each way.
        assert row["hvdx_bytes_per_step"] == pytest.approx(model_bytes, rel=0.01)
        assert row["hvdx_received_per_step"] == row["hvdx_bytes_per_step"]
        assert abs(row["bytes_agreement"] - 1.0) <= 0.10, row
        assert row["prediction_error"] is not None
        assert run["final_stats"]["consensus_distance"] >= 0


def test_contention_events_are_replayed_for_each_run_from_its_launch(bench):
    for run in bench[2]["runs"]:
        assert [change[1:] for change in run["contention"]] == [["uplink", 90_000_000]], run


def test_an_invalid_rate_is_refused_before_anything_is_created():
    proc = subprocess.run([sys.executable, "-m", "hvdx.cli", "bench", "--uplink", "fast"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "uplink='fast'" in proc.stderr

