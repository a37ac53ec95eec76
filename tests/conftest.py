"""Test-session rules shared by every test directory.

Under ``mpirun`` (pytest-mpi's ``--with-mpi``):

- only rank 0 prints pytest's report and writes the JUnit file; the other ranks stay
  quiet unless a test fails there;
- a test that fails on any rank aborts the whole job at once (``MPI_Abort``), after
  printing that rank's report, because its peers may now be waiting in a collective
  that it will never enter: a failing run must fail, never hang.
"""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _mpi_world():
    if "--with-mpi" not in sys.argv:
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Before the junitxml plugin opens its file: one report per rank.
    world = _mpi_world()
    if world is not None and world.Get_rank() > 0 and getattr(config.option, "xmlpath", None):
        config.option.xmlpath = f"{config.option.xmlpath}.rank{world.Get_rank()}"


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    # After the terminal plugin registered its reporter: silence it on ranks > 0.
    world = _mpi_world()
    if world is not None and world.Get_rank() > 0:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    world = _mpi_world()
    if report.failed and world is not None and world.Get_size() > 1:
        rank = world.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n"
                         f"{report.longreprtext}\n[rank {rank}] aborting all ranks\n")
        sys.stderr.flush()
        world.Abort(1)
