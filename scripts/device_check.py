"""Every code path of hvdx that differs on CUDA tensors, run on this machine's GPU.

``scripts/device_check`` is the entry point (``--help`` for the options); the checks
themselves are ``scripts/device_check_job.py``. One run:

1. without a CUDA device (``torch.cuda.is_available()`` false) and without
   ``--device cpu``: one line saying so and naming the checks it would run; exit 0;
2. the checks of the 2-rank job (TopK, the mixers, Stanza, checkpoints, the bench's
   workloads, the examples, the timeline, the step log) run in one
   ``mpirun -n 2`` job, every rank on ``cuda:<local rank modulo the GPUs>`` (or the
   CPU with ``--device cpu``); ``hvdx bench --overlap``'s in one process of its own,
   which launches the bench's job;
3. each launch is watched through the ranks' progress files: a check that records
   nothing for ``--timeout`` seconds is a hang, its job is killed; a job that ends
   during a check (an exception, an abort, a crash) fails that check; either way the
   checks not yet decided are launched again, without the decided ones;
4. past ``--budget`` seconds (default 480: 8 minutes) the running check is stopped
   and the rest are not run;
5. after the 2-rank job has ended, the step log's files, written at exit, are read;
6. one table: check | device | result | seconds | note, then the totals; the exit
   status is 0 when every check passed (or was skipped with its reason).

Only the standard library is imported at module level; torch is imported to ask for
a device, the check list comes from the job file (which imports torch and numpy only).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
JOB = HERE / "device_check_job.py"
RANKS = 2
#: Seconds of silence after which a check counts as hung.
TIMEOUT_S = 150.0
#: Seconds for the whole run: the time a GPU is lent for.
BUDGET_S = 480.0
#: Seconds a launch may take to start its first check (MPI, torch, Horovod), on top
#: of ``--timeout``.
STARTUP_S = 120.0
#: Seconds a killed launch gets to end on SIGTERM before SIGKILL.
GRACE_S = 5.0
#: Seconds between two looks at the progress files.
POLL_S = 0.25


def load_job():
    """``scripts/device_check_job.py`` as a module (its check list; no MPI started)."""
    spec = importlib.util.spec_from_file_location("device_check_job", JOB)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple looks its module up there
    spec.loader.exec_module(module)
    return module


@dataclass
class Row:
    """One line of the table."""

    check: str
    device: str = "-"
    result: str = "not run"
    seconds: Optional[float] = None
    note: str = ""


@dataclass
class Launch:
    """One launch of the job file and what its ranks recorded."""

    kind: str                      # "main" or "host"
    checks: List[str]
    prefix: str
    ranks: int
    returncode: Optional[int] = None
    killed: str = ""               # why the driver killed it, if it did
    events: Dict[str, List[dict]] = field(default_factory=dict)  # check -> its events


def read_events(prefix: str, ranks: int) -> Dict[str, List[dict]]:
    """``{check: [event of every rank, rank by rank, in order]}`` from the progress files
    (a line still being written is skipped)."""
    events: Dict[str, List[dict]] = {}
    for rank in range(ranks):
        try:
            with open(f"{prefix}.rank{rank}.jsonl") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events.setdefault(event["check"], []).append(dict(event, rank=rank))
    return events


def decide(launch: Launch, log_tail: str = "") -> Dict[str, Row]:
    """The rows that ``launch`` decided: a check passes where every rank recorded a
    pass, is skipped where every rank skipped it, fails where any rank recorded a
    failure; one that some rank started and none finished failed with the job (a hang
    if the driver killed the job, a crash otherwise). Checks never started are left out
    (the next launch runs them)."""
    rows = {}
    for name in launch.checks:
        events = launch.events.get(name, [])
        ends = [e for e in events if e["event"] != "start"]
        if not events:
            continue
        seconds = max((e.get("seconds", 0.0) for e in ends), default=None)
        device = next((e["device"] for e in ends if e.get("device")), "-")
        failed = [e for e in ends if e["event"] == "fail"]
        if failed:
            rows[name] = Row(name, device, "FAIL", seconds,
                             f"rank {failed[0]['rank']}: {failed[0]['note']}"
                             if "traceback" in failed[0] else failed[0]["note"])
        elif len(ends) == launch.ranks and all(e["event"] == "pass" for e in ends):
            rows[name] = Row(name, device, "pass", seconds, ends[0].get("note", ""))
        elif len(ends) == launch.ranks and all(e["event"] == "skip" for e in ends):
            rows[name] = Row(name, device, "skip", seconds, ends[0].get("note", ""))
        elif launch.killed:
            rows[name] = Row(name, device, "hang" if "budget" not in launch.killed else
                             "FAIL", seconds, launch.killed)
        else:
            rows[name] = Row(name, device, "FAIL", seconds,
                             f"the job ended (exit {launch.returncode}) during this check"
                             + (f": {log_tail}" if log_tail else ""))
    return rows


def last_error_line(log: str) -> str:
    """The last line of a job's output that names an error, else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or "Exception" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""


class Driver:
    """Steps 2-5 of the module docstring."""

    def __init__(self, job, device: str, timeout: float, budget: float, workdir: str,
                 say=lambda text: print(text, file=sys.stderr, flush=True)):
        self.job, self.device, self.timeout, self.budget = job, device, timeout, budget
        self.workdir, self.say = workdir, say
        self.started = time.monotonic()
        self.count = 0  # launches so far
        self.reported = set()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def command(self, kind: str, checks: Sequence[str], prefix: str) -> List[str]:
        args = [sys.executable, str(JOB), "--launch", kind, "--device", self.device,
                "--checks", ",".join(checks), "--progress", prefix, "--tmp", self.workdir]
        return (["mpirun", "-n", str(RANKS)] + args) if kind == "main" else args

    def environment(self) -> Dict[str, str]:
        env = dict(os.environ)
        # This checkout's hvdx, whatever the environment has installed.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env["HOROVOD_TIMELINE"] = "DYNAMIC"  # the timeline check starts and stops one
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS: bitwise resumes
        return env

    def launch(self, kind: str, checks: List[str]) -> tuple:
        """Run one launch of ``checks`` to its end, or kill it (step 3)."""
        self.count += 1
        prefix = os.path.join(self.workdir, f"{kind}-{self.count}")
        launch = Launch(kind, checks, prefix, RANKS if kind == "main" else 1)
        with open(prefix + ".log", "w") as log:
            proc = subprocess.Popen(self.command(kind, checks, prefix), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.environment(), cwd=str(ROOT),
                                    start_new_session=True)
            seen, quiet_since = 0, time.monotonic()
            while proc.poll() is None:
                time.sleep(POLL_S)
                events = read_events(prefix, launch.ranks)
                count = sum(len(v) for v in events.values())
                if count != seen:
                    self.report(events)
                    seen, quiet_since = count, time.monotonic()
                allowed = self.timeout + (0 if seen else STARTUP_S)
                if self.left() <= 0:
                    launch.killed = f"stopped: the run's budget of {self.budget:.0f} s was spent"
                elif time.monotonic() - quiet_since > allowed:
                    launch.killed = f"no progress for {self.timeout:.0f} s: the job was killed"
                if launch.killed:
                    kill(proc, {e["pid"] for v in events.values() for e in v if "pid" in e})
                    break
            launch.returncode = proc.wait()
        launch.events = read_events(prefix, launch.ranks)
        self.report(launch.events)
        with open(prefix + ".log") as f:
            tail = last_error_line(f.read())
        return launch, decide(launch, tail), tail

    def report(self, events: Dict[str, List[dict]]) -> None:
        """One line on stderr per check rank 0 finished, and per failure on any rank,
        since the last look."""
        for name, mine in events.items():
            for e in mine:
                key = (self.count, name, e["rank"], e["event"])
                if e["event"] == "start" or key in self.reported or \
                        (e["rank"] and e["event"] != "fail"):
                    continue
                self.reported.add(key)
                self.say(f"[device_check] {name}: {e['event']} on rank {e['rank']} "
                         f"({e.get('seconds', 0):.1f} s) {e.get('note', '')}".rstrip())

    def run(self, kind: str, checks: List[str]) -> Dict[str, Row]:
        """Launch ``checks`` until each is decided, or the budget ends (steps 3-5)."""
        rows: Dict[str, Row] = {}
        remaining = list(checks)
        while remaining:
            if self.left() <= 0:
                for name in remaining:
                    rows[name] = Row(name, note=f"the run's budget of {self.budget:.0f} s "
                                                "was spent")
                break
            launch, decided, tail = self.launch(kind, remaining)
            rows.update(decided)
            remaining = [n for n in remaining if n not in decided]
            if not decided:  # the job ended before its first check: launching again won't help
                why = launch.killed or f"exit {launch.returncode}: {tail}"
                for name in remaining:
                    rows[name] = Row(name, result="FAIL",
                                     note=f"the job ended before its first check ({why})")
                break
            if kind == "main" and launch.returncode == 0 and not launch.killed:
                self.after_exit(launch, rows)
        return rows

    def after_exit(self, launch: Launch, rows: Dict[str, Row]) -> None:
        """Step 5: the checks whose files their job writes at exit."""
        for name in launch.checks:
            row = rows.get(name)
            ends = [e for e in launch.events.get(name, []) if e.get("after_exit")]
            if row is None or row.result != "pass" or not ends:
                continue
            error = check_step_log(ends[0]["after_exit"])
            if error:
                row.result, row.note = "FAIL", error


def check_step_log(expected: dict) -> Optional[str]:
    """The step log's files (``hvdx.step_log``): one per rank, each with one optimizer
    of ``steps`` increasing times, its parameter bytes and TopK's byte counters."""
    for rank in range(expected["ranks"]):
        path = f"{expected['prefix']}.rank{rank}.json"
        try:
            with open(path) as f:
                figures = json.load(f)
        except (OSError, ValueError) as error:
            return f"rank {rank}'s step log was not written at exit: {error}"
        optimizers = figures.get("optimizers", [])
        if len(optimizers) != 1:
            return f"rank {rank}'s step log holds {len(optimizers)} optimizers, not 1"
        times, stats = optimizers[0]["times"], optimizers[0].get("hvdx_stats") or {}
        if len(times) != expected["steps"] or any(b <= a for a, b in zip(times, times[1:])):
            return f"rank {rank}: {len(times)} step times, not {expected['steps']} increasing"
        if optimizers[0]["parameter_bytes"] != expected["parameter_bytes"]:
            return f"rank {rank}: {optimizers[0]['parameter_bytes']} parameter bytes"
        if expected["ranks"] > 1 and not stats.get("total_sent", 0) > 0:
            return f"rank {rank}: no hvdx bytes in the step log ({stats})"
    return None


def kill(proc: subprocess.Popen, pids: Sequence[int]) -> None:
    """End a launch: SIGTERM to its process group (Hydra's ``mpirun`` hands it on to
    the ranks, whose proxies run in sessions of their own), SIGKILL to the group after
    :data:`GRACE_S`, then SIGKILL to each rank the progress files named (``pids``)
    that is still this job's."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=GRACE_S)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if JOB.name.encode() not in f.read():
                    continue  # gone, and its number reused
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def render(rows: List[Row], header: str, wall_s: float) -> str:
    """The table (Markdown) and the totals."""
    lines = [header, "", "| check | device | result | seconds | note |", "|---|---|---|---|---|"]
    for r in rows:
        seconds = "-" if r.seconds is None else f"{r.seconds:.1f}"
        note = r.note.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.check} | {r.device} | {r.result} | {seconds} | {note} |")
    counts = {k: sum(r.result == k for r in rows) for k in ("pass", "skip")}
    failed = len(rows) - counts["pass"] - counts["skip"]
    lines += ["", f"{counts['pass']} passed, {failed} failed, {counts['skip']} skipped "
                  f"in {wall_s:.0f} s"]
    return "\n".join(lines)


def describe_device(device: str) -> str:
    """The line above the table: torch, the device, the ranks and Horovod's build."""
    import torch

    parts = [f"torch {torch.__version__}"]
    if device == "cuda":
        parts.append(f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, "
                     f"CUDA {torch.version.cuda}")
    else:
        parts.append("CPU tensors (--device cpu)")
    try:
        import horovod.torch as horovod

        parts.append(f"Horovod built with CUDA: {'yes' if horovod.cuda_built() else 'no'}, "
                     f"NCCL: {'yes' if horovod.nccl_built() else 'no'}")
    except ImportError as error:
        parts.append(f"horovod.torch does not import: {error}")
    return f"device check, {RANKS} ranks: " + "; ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/device_check",
        description="Run every hvdx code path that differs on CUDA tensors and print one "
                    "table (check | device | result | seconds | note).")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): this machine's GPU; cpu: the same checks on "
                             "CPU tensors, which proves the checks themselves")
    parser.add_argument("--only", default="",
                        help="comma-separated check names (default: every check)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help="seconds without progress before a check counts as hung "
                             "(default %(default)s)")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help="seconds for the whole run (default %(default)s)")
    parser.add_argument("--logs", metavar="DIR",
                        help="keep the jobs' output and progress files in DIR")
    parser.add_argument("--list", action="store_true",
                        help="print every check and what it verifies, and exit")
    args = parser.parse_args(argv)

    job = load_job()
    names = list(job.BODIES)
    if args.list:
        for name, body in job.BODIES.items():
            print(f"{name}: {body.verifies}")
        return 0
    if args.only:
        chosen = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in job.BODIES]
        if unknown:
            parser.error(f"--only: unknown checks {unknown}; see --list")
        names = [n for n in names if n in chosen]

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_check: no CUDA device found (torch.cuda.is_available() is False), so "
              f"nothing ran; on a GPU it runs {len(names)} checks: {', '.join(names)} "
              "(--device cpu runs them on CPU tensors)")
        return 0

    header = describe_device(args.device)
    print(header, file=sys.stderr, flush=True)
    workdir = args.logs or tempfile.mkdtemp(prefix="hvdx-device-check-")
    os.makedirs(workdir, exist_ok=True)
    began = time.monotonic()
    try:
        driver = Driver(job, args.device, args.timeout, args.budget, workdir)
        rows: Dict[str, Row] = {}
        for kind in ("main", "host"):
            mine = [n for n in names if job.BODIES[n].launch == kind]
            if mine:
                rows.update(driver.run(kind, mine))
    finally:
        if not args.logs:
            shutil.rmtree(workdir, ignore_errors=True)
    ordered = [rows.get(n, Row(n)) for n in names]
    print(render(ordered, header, time.monotonic() - began), flush=True)
    return 0 if all(r.result in ("pass", "skip") for r in ordered) else 1


if __name__ == "__main__":
    sys.exit(main())
