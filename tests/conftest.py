"""Test-session rules shared by every test directory.

Under ``mpirun`` (pytest-mpi's ``--with-mpi``):

- only rank 0 prints pytest's report and writes the JUnit file; the other ranks stay
  quiet unless a test fails there;
- a test that fails on any rank aborts the whole job at once (``MPI_Abort``), after
  printing that rank's report, because its peers may now be waiting in a collective
  that it will never enter: a failing run must fail, never hang;
- a test marked ``up_to_two_ranks(reason)`` (itself or its module), and not
  ``all_sizes``, is skipped in a job of more than two ranks. On the suite's 2 cores every
  collective of a 4-rank job waits for a descheduled rank (about 8 ms an allreduce,
  against microseconds at 2 ranks), so the 4-rank jobs' time goes to what needs more
  than two ranks: groups, graphs, shards, roles, and the references at a third and
  fourth rank's offsets.

Every test directory: each catalogue entry (:data:`hvdx.strategies.catalogue.BUILT_IN`:
``topk``, ``dssync``, ``decentralized``, ``stanza``, and ``user_compression`` and
``user_mixer`` for the compressors and mixers users register) is a marker of its own name,
registered here from the catalogue, so a new built-in strategy has its marker with no
edit. A test module says which strategies it tests with ``pytestmark``, and
``pytest -m dssync`` runs those (tests/unit/test_strategy_markers.py keeps the marks
true).
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
    # The catalogue imports no framework (tests/unit/test_strategy_catalogue.py).
    from hvdx.strategies import catalogue

    for entry in catalogue.BUILT_IN:
        config.addinivalue_line("markers", f"{entry.name}: tests {entry.title} "
                                f"(select with -m {entry.name})")
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


def pytest_collection_modifyitems(config, items):
    world = _mpi_world()
    if world is None or world.Get_size() <= 2:
        return
    for item in items:
        marker = item.get_closest_marker("up_to_two_ranks")
        if marker is not None and item.get_closest_marker("all_sizes") is None:
            reason = marker.args[0] if marker.args else marker.kwargs["reason"]
            item.add_marker(pytest.mark.skip(reason=f"checked at 1 and 2 ranks: {reason}"))


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
