"""examples/multi_host.sh: the commands it prints, and the HVDX_RACK it gives each rank."""

import os
import pathlib
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.topk, pytest.mark.dssync]

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = "examples/multi_host.sh"
BIN = pathlib.Path(sys.executable).parent


def run(*args, racks=None):
    """``bash examples/multi_host.sh ARGS``, with ``MULTI_HOST_RACKS=racks`` if given."""
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    environment.pop("MULTI_HOST_RACKS", None)
    if racks is not None:
        environment["MULTI_HOST_RACKS"] = racks
    return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


def test_without_hosts_it_prints_both_launchers_commands_and_runs_nothing():
    proc = run()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    environment = "MULTI_HOST_RACKS=host1=rack1,host2=rack2 HVDX_LINK_RATES=25gbit,100gbit"
    rank = "bash examples/multi_host.sh --set-rack -- python examples/torch_digits.py " \
           "--strategy dssync"
    assert lines == [
        "# horovodrun:",
        f"{environment} horovodrun -np 8 -H host1:4,host2:4 {rank}",
        "# MPICH's mpirun (Hydra):",
        f"{environment} mpirun -n 8 -hosts host1,host2 -ppn 4 {rank}"], proc.stdout


def test_dry_run_takes_the_hosts_racks_slots_and_command():
    proc = run("--dry-run", "--hosts", "a,b,c,d", "--racks", "r1,r1,r2,r2", "--slots", "2",
               "--", "python", "examples/keras_digits.py", "--strategy", "topk")
    assert proc.returncode == 0, proc.stderr
    assert ("MULTI_HOST_RACKS=a=r1,b=r1,c=r2,d=r2 mpirun -n 8 -hosts a,b,c,d -ppn 2 bash "
            "examples/multi_host.sh --set-rack -- python examples/keras_digits.py "
            "--strategy topk") in proc.stdout.splitlines(), proc.stdout
    assert "HVDX_LINK_RATES" not in proc.stdout  # only where given
    proc = run("--dry-run", "--hosts", "a,b", "--racks", "r1")
    assert proc.returncode == 2 and "2 hosts but 1 racks" in proc.stderr, proc.stderr


def test_each_rank_gets_its_hosts_rack_or_the_job_stops():
    host = socket.gethostname()
    proc = run("--set-rack", "--", "printenv", "HVDX_RACK",
               racks=f"elsewhere=r0,{host}=rack-b")
    assert (proc.returncode, proc.stdout) == (0, "rack-b\n"), proc.stderr
    proc = run("--set-rack", "--", "true", racks="elsewhere=r0")
    assert proc.returncode == 1 and "is not in MULTI_HOST_RACKS" in proc.stderr


def test_a_launch_on_this_host_sets_the_variables_on_every_rank():
    proc = run("--launcher", "mpirun", "--hosts", socket.gethostname(), "--slots", "2",
               "--racks", "rack-a", "--link-rates", "1gbit,100mbit", "--",
               "bash", "-c", 'echo "$HVDX_RACK $HVDX_LINK_RATES"')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["rack-a 1gbit,100mbit"] * 2, proc.stdout
