"""An unchanged Horovod script switched to an hvdx strategy by the launch environment:
``mpirun -genv`` and ``horovodrun`` (which forwards the launching shell's variables)."""

import pathlib
import sys

import pytest

from test_launchers import BIN, run

pytestmark = [pytest.mark.topk, pytest.mark.dssync]

SCRIPT = str(pathlib.Path(__file__).with_name("horovod_script.py"))


def test_mpirun_genv_hvdx_sync_runs_dssync_with_dynamic_process_sets():
    # Groups of two among three ranks: process sets Horovod must register at run time.
    value = "DSSync('shuffle', group_size=2)"
    proc, _ = run(["mpirun", "-n", "3", "-genv", "HVDX_SYNC", value, sys.executable,
                   SCRIPT], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"[hvdx] HVDX_SYNC={value!r}: hvd.init(process_sets=\"dynamic\")" in proc.stderr
    assert (f"[hvdx] HVDX_SYNC={value!r}: DS-Sync, DSSync(schedule='shuffle', "
            "group_size=2") in proc.stderr
    assert "replicas identical: False" in proc.stdout


def test_horovodrun_forwards_hvdx_compression_to_every_rank(monkeypatch):
    monkeypatch.setenv("HVDX_COMPRESSION", "fast")
    proc, _ = run([str(BIN / "horovodrun"), "-np", "2", sys.executable, SCRIPT],
                  timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr  # horovodrun prefixes and merges the ranks' output
    assert "[hvdx] HVDX_COMPRESSION='fast': bidirectional TopK, ratio=0.01 " \
           "downlink=0.01" in said
    assert said.count("[hvdx] HVDX_COMPRESSION=") == 1  # rank 0 only
    assert "replicas identical: True" in said


@pytest.mark.parametrize("variable, value, reason", [
    # refused by hvd.init, before the script goes on
    ("HVDX_COMPRESSION", "topk(ration=0.1)", "unexpected keyword argument 'ration'"),
    # refused by the optimizer: group_size fits no job of two ranks
    ("HVDX_SYNC", "DSSync('shuffle', group_size=3)", "group_size=3 must be an integer"),
])
def test_a_refused_value_ends_every_rank_with_its_message_once_and_no_traceback(
        variable, value, reason):
    proc, _ = run(["mpirun", "-n", "2", "-genv", variable, value, sys.executable, SCRIPT],
                  timeout=180)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    message = [line for line in said.splitlines() if f"{variable}={value!r}: " in line
               and reason in line]
    assert len(message) == 1 and message[0].startswith("[hvdx] "), said
    assert "Traceback" not in said and "hvdx/" not in said, said
