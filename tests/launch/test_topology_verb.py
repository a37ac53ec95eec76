"""`hvdx topology` under mpirun: every rank takes part, rank 0 alone prints (the text or,
with --json, one JSON object), and a bad flag is one error line for the whole job."""

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def mpirun(*args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    for variable in ("HVDX_RACK", "HVDX_LINK_RATES", "HVDX_CLUSTER_LINK_RATES"):
        env.pop(variable, None)
    return subprocess.run(["mpirun", "-n", "2", sys.executable, "-m", "hvdx.cli", "topology",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_two_ranks_of_one_host_report_once_with_a_measured_link():
    proc = mpirun("--probe-same-host", "--probe-bytes", "256kb")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.count("2 ranks on 1 host (shared-memory split), 1 rack (from probe)") == 1
    assert "bandwidth from row to column (250 KiB transfers" in out
    row = re.search(r"^\s+0\s+-\s+(\S+)$", out, re.M)
    assert row and re.fullmatch(r"[\d.]+[kmgt]?bit", row.group(1)), out
    assert "  step 0 intra: (0 1)" in out
    assert re.search(r"^  host 0 \([^;]+; ranks 0 1\): HVDX_RACK=0$", out, re.M), out
    assert "  HVDX_LINK_RATES: not needed with one rack" in out


def test_with_json_rank_0_prints_one_object_of_the_probe():
    proc = mpirun("--probe-same-host", "--probe-bytes", "256kb", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    report = json.loads(lines[0])
    assert (report["ranks"], report["hosts"], report["rack_source"]) == (2, [[0, 1]], "probe")
    assert report["probe"]["bytes"] == 256_000 and report["probe"]["bps"][0][1] > 0
    assert report["settings"]["HVDX_RACK"] == ["0"]


def test_a_bad_flag_is_one_line_for_the_whole_job():
    proc = mpirun("--probe-bytes", "lots")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert [l for l in lines if "hvdx topology: error:" in l] == \
        [l for l in lines if "--probe-bytes='lots'" in l] and len(lines) == 1, proc.stderr
