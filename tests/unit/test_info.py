"""`hvdx info` reports versions and emulation capability."""

import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def info():
    """The output of one `hvdx info` (it imports torch and TensorFlow: seconds each)."""
    return subprocess.run([sys.executable, "-m", "hvdx.cli", "info"], capture_output=True,
                          text=True, check=True, timeout=300).stdout


def test_hvdx_info_lists_every_component(info):
    for name in ("hvdx", "horovod", "horovod.torch", "horovod.tensorflow", "torch",
                 "tensorflow", "mpi4py", "MPI library", "network emulation"):
        assert any(line.startswith(name + " ") for line in info.splitlines()), info


def test_hvdx_info_shows_horovod_with_mpi_for_both_frameworks(info):
    lines = {line.split()[0]: line for line in info.splitlines() if line.strip()}
    assert "controllers: MPI" in lines["horovod.torch"], info
    assert "controllers: MPI" in lines["horovod.tensorflow"], info
