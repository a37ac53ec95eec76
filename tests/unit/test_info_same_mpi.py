"""`hvdx info`'s "same MPI" row: Horovod's extensions and mpi4py load one MPI library."""

import importlib.util

import pytest

from hvdx import info

MPICH = "/lib/x86_64-linux-gnu/libmpich.so.12"
OPEN_MPI = "/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40"
LDD = f"""\tlinux-vdso.so.1 (0x00007ffd)
\tlibmpich.so.12 => {MPICH} (0x00007f67a7000000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f67a6e00000)
\tlibmpi_cxx.so.40 => /usr/lib/libmpi_cxx.so.40 (0x1)
"""


def test_ldd_output_gives_the_mpi_library_only():
    assert info._linked_mpi(LDD) == [MPICH]
    assert info._linked_mpi(f"\tlibmpi.so.40 => {OPEN_MPI} (0x1)") == [OPEN_MPI]
    assert info._linked_mpi("\tlibc.so.6 => /lib/libc.so.6 (0x1)") == []


def test_one_library_for_all_is_yes():
    verdict = info._same_mpi_verdict([("horovod.torch", [MPICH]), ("mpi4py", [MPICH])])
    assert verdict == f"yes ({MPICH}: horovod.torch, mpi4py)"


def test_two_libraries_is_no_with_the_command_to_rebuild_mpi4py():
    verdict = info._same_mpi_verdict([("horovod.torch", [OPEN_MPI]), ("mpi4py", [MPICH])])
    assert verdict.startswith("NO (horovod.torch: " + OPEN_MPI + "; mpi4py: " + MPICH + ")")
    assert "pip install --no-binary=mpi4py --no-cache-dir --force-reinstall mpi4py" in verdict


def test_nothing_linked_is_unknown():
    assert info._same_mpi_verdict([]).startswith("unknown")
    assert info._same_mpi_verdict([("mpi4py", [])]).startswith("unknown")


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None, reason="no Horovod here")
def test_this_environment_loads_one_mpi():
    """scripts/setup builds Horovod and mpi4py against the one MPICH."""
    assert info._same_mpi().startswith("yes ("), info._same_mpi()
