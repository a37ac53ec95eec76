"""A script started as ``python train.py`` is told once, at ``hvd.init()``, that it runs
one rank and how to start several; one started by a launcher (``mpirun -n 1`` too) is
told nothing."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from hvdx import log
from hvdx.mpi import launch_hint
from hvdx.mpi.launch_hint import LAUNCHER_VARIABLES, hint, launched, say_if_alone

SCRIPT = "import hvdx.torch as hvd\nhvd.init()\nhvd.init()\nprint(hvd.size())\n"
needs_horovod = pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                                   reason="needs Horovod")
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


@pytest.fixture
def unlaunched(monkeypatch):
    """This process as if no launcher had started it, and nothing said yet."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(log.LEVEL_VARIABLE, raising=False)
    monkeypatch.setattr(launch_hint, "_said", False)


def without_a_launcher():
    """The environment of a shell that runs ``python script.py``."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and k != log.LEVEL_VARIABLE}
    return dict(env, OMP_NUM_THREADS="1")


def hvdx_lines(text):
    return [line for line in text.splitlines() if line.startswith("[hvdx")]


def test_one_rank_without_a_launcher_is_told_once_how_to_start_several(unlaunched, capsys):
    say_if_alone(1)
    say_if_alone(1)  # a second hvd.init()
    assert capsys.readouterr().err.splitlines() == [f"[hvdx] {hint()}"]
    assert "horovodrun -np N python" in hint() and "mpirun -n N python" in hint()


def test_the_hint_names_the_script_that_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert f"`horovodrun -np N python {script}`" in hint(str(script))
    assert "`horovodrun -np N python script.py`" in hint("-c")  # python -c: no file


@pytest.mark.parametrize("name", LAUNCHER_VARIABLES)
def test_any_launchers_variable_means_a_deliberate_job(unlaunched, monkeypatch, capsys,
                                                       name):
    monkeypatch.setenv(name, "0")
    assert launched()
    say_if_alone(1)
    assert capsys.readouterr().err == ""


def test_several_ranks_are_never_told(unlaunched, capsys):
    say_if_alone(2)
    assert capsys.readouterr().err == ""


def test_hvdx_log_level_error_silences_the_hint(unlaunched, monkeypatch, capsys):
    monkeypatch.setenv(log.LEVEL_VARIABLE, "error")
    say_if_alone(1)
    assert capsys.readouterr().err == ""


@needs_mpirun
def test_mpirun_n_1_sets_a_launchers_variable_here():
    """What this machine's MPI sets for one rank is among the variables looked for."""
    proc = subprocess.run(["mpirun", "-n", "1", "env"], env=without_a_launcher(),
                          capture_output=True, text=True, timeout=60, check=True)
    environ = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert launched(environ), sorted(environ)


@needs_horovod
def test_hvd_init_without_a_launcher_says_the_hint_once_and_nothing_else():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=without_a_launcher(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\n"  # the script's output, untouched
    assert hvdx_lines(proc.stderr) == [f"[hvdx] {hint('-c')}"], proc.stderr


@needs_horovod
@needs_mpirun
def test_hvd_init_under_mpirun_n_1_says_nothing():
    proc = subprocess.run(["mpirun", "-n", "1", sys.executable, "-c", SCRIPT],
                          env=without_a_launcher(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "1\n" and hvdx_lines(proc.stderr) == [], proc.stderr
