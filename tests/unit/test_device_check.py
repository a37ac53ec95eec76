"""scripts/device_check without a GPU (one line naming the checks, exit 0), and how the
driver turns the ranks' progress files into rows (no MPI, no GPU)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
device_check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = device_check  # dataclasses look their module up there
_spec.loader.exec_module(device_check)


def test_without_a_cuda_device_it_says_so_in_one_line_names_every_check_and_exits_0():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a machine with one
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py")],
                          capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("device_check: no CUDA device found"), lines[0]
    names = list(device_check.load_job().BODIES)
    assert f"runs {len(names)} checks: {', '.join(names)} (--device cpu" in lines[0]


def test_the_entry_point_sets_up_the_environment_and_runs_the_driver():
    text = (ROOT / "scripts" / "device_check").read_text()
    assert '"$here/scripts/setup"' in text
    assert text.rstrip().endswith('exec python "$here/scripts/device_check.py" "$@"')


def test_every_check_runs_in_a_known_launch_and_says_what_it_verifies():
    job = device_check.load_job()
    assert {body.launch for body in job.BODIES.values()} == {"main", "host"}
    assert all(body.verifies for body in job.BODIES.values())
    for path in ("topk gathered", "topk sharded", "topk momentum correction",
                 "topk preset fast", "topk preset safe", "dssync", "decentralized atc",
                 "decentralized cta", "stanza", "workload lm", "workload resnet",
                 "timeline", "step log", "bench --overlap"):
        assert path in job.BODIES


def write_events(prefix, rank, *events):
    with open(f"{prefix}.rank{rank}.jsonl", "w") as f:
        for e in events:
            f.write(json.dumps(dict(e, pid=100 + rank)) + "\n")
        f.write('{"check": "half a li')  # a line still being written is skipped


def start(name):
    return {"check": name, "event": "start"}


def end(name, event, note="", seconds=1.0, **extra):
    return dict(check=name, event=event, note=note, seconds=seconds, device="cuda:0",
                **extra)


def test_rows_from_the_ranks_events(tmp_path):
    prefix = str(tmp_path / "main-1")
    checks = ["ok", "wrong", "raised", "skipped", "running", "never"]
    write_events(prefix, 0, start("ok"), end("ok", "pass", "fine", 2.0),
                 start("wrong"), end("wrong", "fail", "rank 1: differs"),
                 start("raised"), end("raised", "fail", "RuntimeError: no", traceback="..."),
                 start("skipped"), end("skipped", "skip", "no data"), start("running"))
    write_events(prefix, 1, start("ok"), end("ok", "pass", seconds=3.0),
                 start("wrong"), end("wrong", "fail", "rank 1: differs"),
                 start("raised"))
    launch = device_check.Launch("main", checks, prefix, 2, returncode=1)
    launch.events = device_check.read_events(prefix, 2)
    rows = device_check.decide(launch, "MPI_Abort")
    assert set(rows) == {"ok", "wrong", "raised", "skipped", "running"}  # "never": next launch
    assert (rows["ok"].result, rows["ok"].seconds, rows["ok"].note) == ("pass", 3.0, "fine")
    assert (rows["wrong"].result, rows["wrong"].note) == ("FAIL", "rank 1: differs")
    assert (rows["raised"].result, rows["raised"].note) == ("FAIL", "rank 0: RuntimeError: no")
    # Skipped by one rank only: the other never finished it, so it is not a skip.
    assert rows["skipped"].result == "FAIL" and "exit 1" in rows["skipped"].note
    assert rows["running"].result == "FAIL" and rows["running"].note.endswith("MPI_Abort")

    launch.killed = "no progress for 150 s: the job was killed"
    assert device_check.decide(launch)["running"].result == "hang"


def test_a_step_log_is_checked_for_steps_bytes_and_counters(tmp_path):
    prefix = str(tmp_path / "steplog")
    expected = {"prefix": prefix, "ranks": 2, "steps": 3, "parameter_bytes": 40}

    def write(rank, times, stats=None, parameter_bytes=40):
        with open(f"{prefix}.rank{rank}.json", "w") as f:
            json.dump({"rank": rank, "optimizers": [
                {"times": times, "parameter_bytes": parameter_bytes,
                 "hvdx_stats": stats or {"total_sent": 8.0}}]}, f)

    write(0, [1.0, 2.0, 3.0])
    assert "rank 1's step log was not written" in device_check.check_step_log(expected)
    write(1, [1.0, 3.0, 2.0])
    assert "not 3 increasing" in device_check.check_step_log(expected)
    write(1, [1.0, 2.0, 3.0], {"total_sent": 0.0})
    assert "no hvdx bytes" in device_check.check_step_log(expected)
    write(1, [1.0, 2.0, 3.0])
    assert device_check.check_step_log(expected) is None


@pytest.mark.parametrize("results, totals", [
    (["pass", "skip"], "1 passed, 0 failed, 1 skipped in 12 s"),
    (["pass", "hang", "not run", "FAIL"], "1 passed, 3 failed, 0 skipped in 12 s")])
def test_the_table_ends_with_the_totals(results, totals):
    rows = [device_check.Row(f"c{i}", "cuda:0", r, 1.0, "a | b") for i, r in
            enumerate(results)]
    table = device_check.render(rows, "header", 12.0).splitlines()
    assert table[:4] == ["header", "", "| check | device | result | seconds | note |",
                         "|---|---|---|---|---|"]
    assert table[4] == f"| c0 | cuda:0 | {results[0]} | 1.0 | a / b |"
    assert table[-1] == totals
