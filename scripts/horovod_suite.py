"""Horovod 0.28.1's own parallel test suites, run against hvdx in each strategy mode.

hvdx claims to be a drop-in for ``horovod.torch``, ``horovod.tensorflow`` and
``horovod.tensorflow.keras``; Horovod's own parallel suites are the widest check of that
claim we can get without writing it ourselves. This file is both halves of the
measurement (``scripts/horovod_suite`` is the entry point; ``--help`` for the options):

- the driver: for each (suite, mode) it copies the suite into a temporary folder,
  switches its one ``import horovod... as hvd`` line to hvdx (all modes but ``horovod``),
  and runs it as ``mpirun -n 2 python -m pytest -p horovod_suite``;
- the pytest plugin that ``-p horovod_suite`` loads in every rank: it writes each test's
  start and outcome to a per-rank file at once, so that the driver sees where a rank
  stopped even when the job has to be killed.

Why a watchdog and relaunches rather than a per-test timeout inside pytest: a test that
hangs in a collective leaves the ranks out of step (one rank may already be in the next
test), so no single rank can time out cleanly. The driver instead kills the whole job
when no test has finished for ``--timeout`` seconds, records the earliest unfinished test
as ``hang``, and starts the job again without the tests already decided.

Only the standard library is imported at module level: every rank imports this module
as a plugin before Horovod's suite is collected.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

# --- what is run -------------------------------------------------------------------

#: suite -> (file under test/parallel, the import line of v0.28.1, its hvdx twin).
SUITES = {
    "torch": ("test_torch.py", "import horovod.torch as hvd", "import hvdx.torch as hvd"),
    "tensorflow": ("test_tensorflow.py", "import horovod.tensorflow as hvd",
                   "import hvdx.tensorflow as hvd"),
    "keras": ("test_tensorflow2_keras.py", "import horovod.tensorflow.keras as hvd",
              "import hvdx.tensorflow.keras as hvd"),
}

#: mode -> (import switched to hvdx?, environment of the job). DS-Sync needs Horovod's
#: dynamic process sets; with HVDX_SYNC naming DS-Sync, hvdx's ``hvd.init()`` switches
#: them on itself (docs/environment.md), so the variable is all the documented route needs.
MODES = {
    "horovod": (False, {}),
    "hvdx": (True, {}),
    "topk": (True, {"HVDX_COMPRESSION": "topk"}),
    "fast": (True, {"HVDX_COMPRESSION": "fast"}),
    "dssync": (True, {"HVDX_SYNC": "DSSync"}),
    "decentralized": (True, {"HVDX_SYNC": "Decentralized"}),
}

#: A package a suite imports that hvdx's set-up does not install, with the pin of
#: requirements/horovod-suite.txt.
SUITE_NEEDS = {"keras": ("parameterized", "parameterized==0.9.0")}

#: Outcomes, in the order a table lists them. ``crash``: the job ended (a rank died, or
#: MPI_Abort) while the test ran; ``error``: never ran, because the job kept ending
#: before it (see the log).
OUTCOMES = ("pass", "fail", "skip", "hang", "crash", "error")
NOT_RUN = "-"


# --- the pure parts (tests/unit/test_horovod_suite.py) -----------------------------

def rewrite_imports(text: str, suite: str) -> str:
    """``text`` (a suite's source) with its one ``import horovod... as hvd`` line
    switched to hvdx, and every other byte kept.

    Only the whole line is matched: ``import horovod.keras as hvd_keras`` or
    ``from horovod.tensorflow.util import ...`` stay Horovod's, as a user's script would.

    Raises:
        ValueError: the line is not there exactly once (not Horovod v0.28.1's file?).
    """
    _, old, new = SUITES[suite]
    lines = text.splitlines(keepends=True)
    found = [i for i, line in enumerate(lines) if line.rstrip() == old]
    if len(found) != 1:
        raise ValueError(f"expected the line {old!r} once in the {suite} suite, found it "
                         f"{len(found)} times: is this Horovod v0.28.1's file?")
    i = found[0]
    lines[i] = new + lines[i][len(lines[i].rstrip()):]
    return "".join(lines)


def combine(per_rank: Sequence[Optional[str]]) -> Optional[str]:
    """One outcome for a test from each rank's, ``None`` while a rank has not finished.

    A test fails if it fails on any rank; it passes if it passed somewhere and failed
    nowhere (a rank may skip its part); it is skipped only if every rank skipped it.
    Hangs and crashes are decided by the driver, not by the ranks.
    """
    if not per_rank or any(outcome is None for outcome in per_rank):
        return None
    for outcome in ("fail", "pass"):
        if outcome in per_rank:
            return outcome
    return "skip"


def failure_reason(per_rank: Sequence[Optional[str]]) -> str:
    """One line from each rank's failure line (``None``: it did not fail there), the
    ranks that failed alike named together."""
    ranks: Dict[str, List[str]] = {}
    for rank, reason in enumerate(per_rank):
        if reason:
            ranks.setdefault(reason, []).append(str(rank))
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(r)}: {reason}"
                     for reason, r in ranks.items())


def phase_outcome(phases: Dict[str, Dict[str, object]]) -> str:
    """A rank's outcome of one test from its pytest phases (setup, call, teardown):
    a failure in any phase fails it; an expected failure counts as a skip and an
    unexpected pass as a pass, as the table has no columns for them."""
    if any(p["outcome"] == "failed" for p in phases.values()):
        return "fail"
    call = phases.get("call")
    if call is not None and call["outcome"] == "passed":
        return "pass"
    return "skip"


@dataclass
class RankLog:
    """What one rank's report file says so far."""
    pid: Optional[int] = None
    collected: Optional[List[str]] = None
    started: List[str] = field(default_factory=list)
    finished: Dict[str, str] = field(default_factory=dict)
    reasons: Dict[str, str] = field(default_factory=dict)  # nodeid -> why it failed


def read_rank_log(lines: Iterable[str]) -> RankLog:
    """Parse one rank's report; a last line still being written is ignored."""
    log = RankLog()
    for line in lines:
        if not line.endswith("\n"):
            break
        record = json.loads(line)
        if "pid" in record:
            log.pid = record["pid"]
        elif "collected" in record:
            log.collected = record["collected"]
        elif "start" in record:
            log.started.append(record["start"])
        elif "finish" in record:
            log.finished[record["finish"]] = record["outcome"]
            if record.get("reason"):
                log.reasons[record["finish"]] = record["reason"]
    return log


def decide(order: Sequence[str], logs: Sequence[RankLog], ended_by: Optional[str]):
    """The tests one job decided: ``{nodeid: outcome}``.

    Every test finished on all ranks gets its combined outcome. If the job was killed
    (``ended_by="hang"``) or ended by itself with tests still open (``ended_by="crash"``),
    the earliest test that some rank started but not every rank finished gets that
    label: the later ones a rank may have entered were run out of step with their peers,
    so they are left undecided and run again.
    """
    decided = {}
    for nodeid in order:
        outcome = combine([log.finished.get(nodeid) for log in logs])
        if outcome is not None:
            decided[nodeid] = outcome
    if ended_by is not None:
        started = set().union(*(log.started for log in logs)) if logs else set()
        for nodeid in order:
            if nodeid in started and nodeid not in decided:
                decided[nodeid] = ended_by
                break
    return decided


def differing(results: Dict[str, Dict[str, str]], modes: Sequence[str],
              baseline: str) -> List[str]:
    """The tests (keys of ``results``: test -> mode -> outcome) whose outcome in some
    mode differs from the baseline mode's; a test a mode did not reach (an interrupted
    run) is no difference."""
    return [test for test, by_mode in results.items()
            if any(by_mode.get(m, NOT_RUN) not in (NOT_RUN, by_mode.get(baseline, NOT_RUN))
                   for m in modes)]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- the pytest plugin (active in the ranks only: HVDX_SUITE_REPORT is set) --------

_REPORT_DIR = os.environ.get("HVDX_SUITE_REPORT")
_report = None
_phases: Dict[str, Dict[str, Dict[str, object]]] = {}


def _rank() -> int:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def _write(record) -> None:
    # One line per event, flushed at once: the driver may kill this process any moment.
    global _report
    if _report is None:
        _report = open(os.path.join(_REPORT_DIR, f"rank{_rank()}.jsonl"), "a", buffering=1)
    _report.write(json.dumps(record) + "\n")
    _report.flush()


def pytest_configure(config):
    if _REPORT_DIR:
        _write({"pid": os.getpid()})


def pytest_collection_modifyitems(config, items):
    if not _REPORT_DIR:
        return
    skip_file = os.path.join(_REPORT_DIR, "deselect.txt")
    skip = set()
    if os.path.exists(skip_file):
        with open(skip_file) as f:
            skip = set(f.read().split("\n"))
    dropped = [item for item in items if item.nodeid in skip]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in skip]
    _write({"collected": [item.nodeid for item in items]})


def pytest_runtest_logstart(nodeid, location):
    if _REPORT_DIR:
        _phases[nodeid] = {}
        _write({"start": nodeid})


def failure_line(text: str) -> str:
    """The line of a pytest failure report that says what went wrong: its last ``E``
    line (the exception), else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    return (errors or lines or [""])[-1][:300]


def pytest_runtest_logreport(report):
    if _REPORT_DIR:
        phase = {"outcome": report.outcome}
        if report.failed:
            phase["reason"] = failure_line(report.longreprtext)
        _phases.setdefault(report.nodeid, {})[report.when] = phase


def pytest_runtest_logfinish(nodeid, location):
    if _REPORT_DIR:
        phases = _phases.pop(nodeid, {})
        record = {"finish": nodeid, "outcome": phase_outcome(phases)}
        for when, phase in phases.items():
            if phase.get("reason"):
                record["reason"] = ("" if when == "call" else f"in {when}: ") + phase["reason"]
                break
        _write(record)


# --- the driver --------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
POLL_S = 0.5
PROGRESS_EVERY_S = 15


def say(message: str) -> None:
    print(f"[horovod_suite] {message}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One (suite, mode): its outcomes and what it cost."""
    suite: str
    mode: str
    outcomes: Dict[str, str] = field(default_factory=dict)  # nodeid -> outcome
    reasons: Dict[str, str] = field(default_factory=dict)  # nodeid -> why, if not passed
    order: List[str] = field(default_factory=list)
    seconds: float = 0.0
    launches: int = 0
    note: str = ""
    interrupted: bool = False


#: ``mock``: unittest.mock under its backport's name. parameterized (the keras suite)
#: reads the backport's ``version_info``; the backport's 5.x line is the one that matches
#: Python 3.11's unittest.mock.
MOCK_SHIM = """from unittest import mock as _mock

globals().update({k: v for k, v in vars(_mock).items() if not k.startswith("__")})
version_info = (5, 1, 0)
"""


def _prepare(work: str, horovod_dir: str, suite: str, mode: str) -> str:
    """The job's folder: the suite (import switched for hvdx modes), a ``mock`` module
    (Horovod's test/utils/common.py imports the old backport; the standard library's
    unittest.mock is the same API), and an empty pytest.ini so that no configuration
    around the folder applies. Returns the suite's path relative to ``work``."""
    name = SUITES[suite][0]
    with open(os.path.join(horovod_dir, "test", "parallel", name)) as f:
        text = f.read()
    if MODES[mode][0]:
        text = rewrite_imports(text, suite)
    os.makedirs(os.path.join(work, "parallel"))
    os.makedirs(os.path.join(work, "shim"))
    with open(os.path.join(work, "parallel", name), "w") as f:
        f.write(text)
    with open(os.path.join(work, "shim", "mock.py"), "w") as f:
        f.write(MOCK_SHIM)
    with open(os.path.join(work, "pytest.ini"), "w") as f:
        f.write("[pytest]\n")
    return os.path.join("parallel", name)


def _environment(work: str, horovod_dir: str, mode: str) -> Dict[str, str]:
    env = dict(os.environ)
    for name in ("HVDX_COMPRESSION", "HVDX_SYNC"):
        env.pop(name, None)
    env.update(MODES[mode][1])
    test = os.path.join(horovod_dir, "test")
    # shim: mock; HERE: this plugin; parallel: base_test_tensorflow; utils and test:
    # `from common import` and `from utils.common import`.
    paths = [os.path.join(work, "shim"), HERE, os.path.join(test, "parallel"),
             os.path.join(test, "utils"), test]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _read_logs(report_dir: str, ranks: int) -> List[RankLog]:
    logs = []
    for rank in range(ranks):
        path = os.path.join(report_dir, f"rank{rank}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                logs.append(read_rank_log(f))
        else:
            logs.append(RankLog())
    return logs


def _descendants(pid: int) -> List[int]:
    """The processes under ``pid``. Hydra starts its proxy and each rank with setsid(),
    so mpirun's process group does not hold them."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(process: subprocess.Popen, logs: Sequence[RankLog]) -> None:
    """End the job: mpirun, the processes under it (proxy, ranks) and any rank that
    left them, by the pid it reported; SIGTERM first, then SIGKILL."""
    pids = [process.pid, *_descendants(process.pid), *(log.pid for log in logs if log.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids[1:]):
            time.sleep(0.2)
        if process.poll() is None:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
        if not any(_alive(pid) for pid in pids[1:]):
            break
    process.wait()


def _alive(pid: int) -> bool:
    # A killed child of mpirun stays a zombie until mpirun reaps it: count it dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def run_one(horovod_dir: str, suite: str, mode: str, timeout: float, ranks: int,
            logs_dir: Optional[str]) -> Run:
    """Run one suite in one mode to the end, relaunching after each hang or crash."""
    run = Run(suite, mode)
    work = tempfile.mkdtemp(prefix=f"{suite}-{mode}-", dir=logs_dir)
    started = time.monotonic()
    report_dir = None
    try:
        target = _prepare(work, horovod_dir, suite, mode)
        env = _environment(work, horovod_dir, mode)
        while True:
            run.launches += 1
            report_dir = os.path.join(work, f"launch{run.launches}")
            os.makedirs(report_dir)
            with open(os.path.join(report_dir, "deselect.txt"), "w") as f:
                f.write("\n".join(run.outcomes))
            env["HVDX_SUITE_REPORT"] = report_dir
            log_path = os.path.join(work, f"launch{run.launches}.log")
            command = ["mpirun", "-n", str(ranks), sys.executable, "-m", "pytest",
                       "-p", "horovod_suite", "-p", "no:cacheprovider", "-c", "pytest.ini",
                       "--rootdir", work, "-q", target]
            say(f"{suite}/{mode}: launch {run.launches}"
                + (f", {len(run.outcomes)} tests already decided" if run.outcomes else ""))
            with open(log_path, "w") as log_file:
                process = subprocess.Popen(command, cwd=work, env=env, stdout=log_file,
                                           stderr=subprocess.STDOUT)
                try:
                    ended_by, logs = _watch(process, report_dir, ranks, timeout, run, started)
                except BaseException:  # Ctrl-C, say: leave no rank behind
                    _kill(process, _read_logs(report_dir, ranks))
                    raise
            order = next((log.collected for log in logs if log.collected is not None), None)
            if run.launches == 1:
                if not order:  # an import error, say: pytest ran nothing
                    run.note = f"nothing collected (exit {process.returncode}): {_tail(log_path)}"
                    break
                run.order = list(order)
            new = decide(order or [], logs, ended_by)
            for nodeid, outcome in new.items():
                if outcome in ("hang", "crash"):
                    say(f"{suite}/{mode}: {outcome.upper()} in {_short(nodeid)}")
                    stuck = [str(r) for r, log in enumerate(logs) if nodeid not in log.finished]
                    run.reasons[nodeid] = (
                        f"rank {', '.join(stuck)} never finished it" + (
                            f" ({timeout:.0f} s without a finished test)"
                            if outcome == "hang" else f" (the job ended, exit "
                                                      f"{process.returncode})"))
                elif outcome == "fail":
                    why = failure_reason([log.reasons.get(nodeid) for log in logs])
                    if why:
                        run.reasons[nodeid] = why
            run.outcomes.update(new)
            left = [t for t in run.order if t not in run.outcomes]
            if not left:
                if ended_by == "hang":
                    run.note = "every test finished, then the job hung at exit (killed)"
                break
            if not new:
                for nodeid in left:
                    run.outcomes[nodeid] = "error"
                run.note = (f"the job ended (exit {process.returncode}) before {len(left)} "
                            f"tests ran: {_tail(log_path)}")
                break
    except KeyboardInterrupt:  # the job is ended (_watch); keep what it decided
        run.interrupted = True
        if report_dir is not None:
            logs = _read_logs(report_dir, ranks)
            order = next((log.collected for log in logs if log.collected is not None), [])
            run.order = run.order or list(order)
            run.outcomes.update(decide(order, logs, None))
        left = len([t for t in run.order if t not in run.outcomes])
        run.note = f"interrupted, {left} tests not run"
    finally:
        run.seconds = time.monotonic() - started
        if logs_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    counts = ", ".join(f"{n} {o}" for o in OUTCOMES
                       if (n := sum(v == o for v in run.outcomes.values())))
    say(f"{suite}/{mode}: done in {run.seconds:.0f} s, {run.launches} launch(es): {counts}")
    return run


def _watch(process, report_dir, ranks, timeout, run, started):
    """Wait for the job; kill it when no test finished for ``timeout`` seconds.
    Returns ``(ended_by, logs)``: ``"hang"``, ``"crash"`` (it ended with a test open)
    or ``None``."""
    last_count, last_change, last_said = -1, time.monotonic(), 0.0
    while True:
        exited = process.poll() is not None
        logs = _read_logs(report_dir, ranks)
        count = sum(len(log.finished) for log in logs)
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if now - last_said >= PROGRESS_EVERY_S:
            total = len(run.order) or next(
                (len(log.collected) for log in logs if log.collected is not None), 0)
            done = len(run.outcomes) + min((len(log.finished) for log in logs), default=0)
            say(f"{run.suite}/{run.mode}: {done}/{total or '?'} tests done, "
                f"{now - started:.0f} s")
            last_said = now
        if exited:
            logs = _read_logs(report_dir, ranks)
            open_ = any(set(log.started) - set(log.finished) for log in logs)
            return ("crash" if open_ else None), logs
        if now - last_change > timeout:
            _kill(process, logs)
            return "hang", _read_logs(report_dir, ranks)
        time.sleep(POLL_S)


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read().strip().splitlines()[-lines:]
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text)


# --- the report --------------------------------------------------------------------

def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", os.path.dirname(HERE), *args], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def report(runs: List[Run], suites: Sequence[str], modes: Sequence[str], full: bool) -> str:
    """Markdown: a summary per suite and mode, then the tests (those whose outcome
    differs from the baseline mode's, or all of them with ``full``)."""
    baseline = "horovod" if "horovod" in modes else modes[0]
    out = ["| suite | mode | " + " | ".join(OUTCOMES) + " | seconds | launches | note |",
           "|" + "---|" * (len(OUTCOMES) + 5)]
    for r in runs:
        counts = [sum(v == o for v in r.outcomes.values()) for o in OUTCOMES]
        out.append(f"| {r.suite} | {r.mode} | " + " | ".join(map(str, counts))
                   + f" | {r.seconds:.0f} | {r.launches} | {r.note.replace('|', '/')} |")
    text = "\n".join(out) + "\n"
    for suite in suites:
        by_test: Dict[str, Dict[str, str]] = {}
        suite_runs = [r for r in runs if r.suite == suite]
        for r in suite_runs:
            for nodeid in r.order:
                by_test.setdefault(_short(nodeid), {})
            for nodeid, outcome in r.outcomes.items():
                by_test.setdefault(_short(nodeid), {})[r.mode] = outcome
        if not by_test:
            continue
        ran = [m for m in modes if any(r.mode == m for r in suite_runs)]  # Ctrl-C
        shown = list(by_test) if full else differing(by_test, ran, baseline)
        what = "every test" if full else f"tests whose outcome differs from {baseline}'s"
        text += f"\n{suite} ({SUITES[suite][0]}): {what}: {len(shown)} of {len(by_test)}\n\n"
        if shown:
            text += markdown_table(["test", *modes],
                                   ([t, *(by_test[t].get(m, NOT_RUN) for m in modes)]
                                    for t in shown))
        if full:
            text += _reasons(suite_runs, modes)
    return text


def _reasons(runs: List[Run], modes: Sequence[str]) -> str:
    """Why each test failed, hung or crashed, one line per test and reason (the modes
    that share a reason on one line)."""
    by_test: Dict[str, Dict[str, List[str]]] = {}
    for r in sorted(runs, key=lambda r: modes.index(r.mode)):
        for nodeid, reason in r.reasons.items():
            by_test.setdefault(_short(nodeid), {}).setdefault(reason, []).append(r.mode)
    if not by_test:
        return ""
    lines = ["", "Why (the first failing line, per rank):", ""]
    for test in sorted(by_test):
        for reason, in_modes in by_test[test].items():
            text = reason.replace("`", "'")
            lines.append(f"- {test} ({', '.join(in_modes)}): `{text}`")
    return "\n".join(lines) + "\n"


def _split(value: str, known: Sequence[str], what: str) -> List[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown or not items:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or '(none)'}: choose from {', '.join(known)}")
    return items


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/horovod_suite",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run Horovod 0.28.1's parallel test suites (test/parallel) against "
                    "hvdx at 2 ranks, per strategy mode, and print pass / fail / skip / "
                    "hang per test and mode.",
        epilog="modes:\n"
               "  horovod        the suite as Horovod ships it (plain Horovod)\n"
               "  hvdx           its import line switched to hvdx, no strategy\n"
               "  topk, fast     hvdx and HVDX_COMPRESSION=topk / fast\n"
               "  dssync         hvdx and HVDX_SYNC=DSSync (hvd.init() then switches on\n"
               "                 Horovod's dynamic process sets itself: nothing else to set)\n"
               "  decentralized  hvdx and HVDX_SYNC=Decentralized\n\n"
               "HOROVOD_DIR is a checkout of Horovod at tag v0.28.1 (its test/ folder is "
               "enough):\n"
               "  git clone --depth 1 --branch v0.28.1 https://github.com/horovod/horovod\n"
               "The keras suite needs the parameterized package:\n"
               "  pip install -r requirements/horovod-suite.txt\n\n"
               "A hang: no test finished for --timeout seconds. The job is killed, the\n"
               "earliest unfinished test is recorded as hang, and the job is started\n"
               "again without the tests already decided. crash: the job ended while the\n"
               "test ran. A test fails if it fails on any rank. Ctrl-C or SIGTERM ends the\n"
               "running job and prints what was decided so far.")
    p.add_argument("horovod_dir", metavar="HOROVOD_DIR")
    p.add_argument("--suites", default="torch,tensorflow,keras",
                   type=lambda v: _split(v, list(SUITES), "suite"),
                   help="comma-separated, of: %(default)s")
    p.add_argument("--modes", default=",".join(MODES),
                   type=lambda v: _split(v, list(MODES), "mode"),
                   help="comma-separated, of: %(default)s")
    p.add_argument("--timeout", type=float, default=60,
                   help="seconds without a finished test before the job counts as hung "
                        "(default %(default)s)")
    p.add_argument("--np", type=int, default=2, help="ranks (default %(default)s)")
    p.add_argument("--out", metavar="FILE", help="write the full per-test table as Markdown")
    p.add_argument("--logs", metavar="DIR", help="keep each job's output in DIR")
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    # Ctrl-C, or SIGTERM (`timeout`, a job started in the background, where SIGINT is
    # ignored) ends the running job and prints what was decided so far.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    horovod_dir = os.path.abspath(args.horovod_dir)
    missing = [SUITES[s][0] for s in args.suites
               if not os.path.exists(os.path.join(horovod_dir, "test", "parallel", SUITES[s][0]))]
    if missing:
        say(f"{horovod_dir} has no test/parallel/{', '.join(missing)}: HOROVOD_DIR is a "
            f"checkout of Horovod v0.28.1 (see --help)")
        return 2
    if shutil.which("mpirun") is None:
        say("no mpirun on PATH (run scripts/setup: it installs MPICH)")
        return 2
    suites = list(args.suites)
    unrunnable = []
    for suite in list(suites):
        if suite in SUITE_NEEDS:
            module, pin = SUITE_NEEDS[suite]
            if importlib.util.find_spec(module) is None:
                say(f"the {suite} suite needs the {module} package, which is not installed: "
                    f"pip install -r requirements/horovod-suite.txt (that is, {pin}); "
                    f"skipping the {suite} suite")
                suites.remove(suite)
                unrunnable.append(suite)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
        args.logs = os.path.abspath(args.logs)
    commit = _git("log", "-1", "--format=%h")
    dirty = "dirty" if _git("status", "--porcelain", "--untracked-files=no") else "clean"
    say(f"hvdx {commit} ({dirty} tree); suites {', '.join(suites)}; modes "
        f"{', '.join(args.modes)}; {args.np} ranks; timeout {args.timeout:.0f} s")
    started = time.monotonic()
    runs = []
    for suite, mode in [(s, m) for s in suites for m in args.modes]:
        runs.append(run_one(horovod_dir, suite, mode, args.timeout, args.np, args.logs))
        if runs[-1].interrupted:
            break
    total = time.monotonic() - started
    header = (f"hvdx {commit} ({dirty} working tree), Horovod's suites from v0.28.1, "
              f"{args.np} ranks, timeout {args.timeout:.0f} s, {total:.0f} s in all\n\n")
    if unrunnable:
        header += f"not run (a package is missing): {', '.join(unrunnable)}\n\n"
    print(header + report(runs, suites, args.modes, full=False), end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + report(runs, suites, args.modes, full=True))
        say(f"wrote {args.out}")
    if runs and runs[-1].interrupted:
        return 130
    broken = unrunnable or any(r.note.startswith("nothing collected") for r in runs)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
