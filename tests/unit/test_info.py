"""`hvdx info` reports versions and emulation capability."""

import subprocess
import sys


def test_hvdx_info_lists_every_component():
    out = subprocess.run([sys.executable, "-m", "hvdx.cli", "info"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    for name in ("hvdx", "horovod", "horovod.torch", "horovod.tensorflow", "torch",
                 "tensorflow", "mpi4py", "MPI library", "network emulation"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), out


def test_hvdx_info_shows_horovod_with_mpi_for_both_frameworks():
    out = subprocess.run([sys.executable, "-m", "hvdx.cli", "info"], capture_output=True,
                         text=True, check=True, timeout=300).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "controllers: MPI" in lines["horovod.torch"], out
    assert "controllers: MPI" in lines["horovod.tensorflow"], out
