"""hvdx's read of Horovod's process-set table (``registered_sets``): Horovod reads it
without its lock, so a set being set up or torn down makes the read fail for a moment
with "not initialized properly"; hvdx reads again while Horovod is initialized."""

import types

import pytest

from hvdx.mpi import dssync_groups


def horovod(failures, initialized=True):
    """A stand-in Horovod whose table read fails ``failures`` times first."""
    calls = []

    def read():
        calls.append(1)
        if len(calls) <= failures:
            raise ValueError("Horovod has not been initialized properly; use hvd.init().")
        return {0: [0, 1, 2, 3], 3: [0, 1]}

    class ProcessSet:
        def __init__(self, ranks):
            self.ranks = ranks

    fake = types.SimpleNamespace(
        mpi_ops=types.SimpleNamespace(_basics=types.SimpleNamespace(
            _get_process_set_ids_and_ranks=read)),
        is_initialized=lambda: initialized, ProcessSet=ProcessSet)
    return fake, calls


def test_a_read_that_fails_for_a_moment_is_read_again():
    fake, calls = horovod(failures=3)
    sets = dssync_groups.registered_sets(fake)
    assert list(sets) == [(0, 1)] and sets[(0, 1)].process_set_id == 3
    assert len(calls) == 4


def test_horovod_shut_down_is_said_at_once():
    fake, calls = horovod(failures=1, initialized=False)
    with pytest.raises(ValueError, match="not been initialized"):
        dssync_groups.registered_sets(fake)
    assert len(calls) == 1


def test_a_table_that_never_reads_fails_after_the_retry_time(monkeypatch):
    monkeypatch.setattr(dssync_groups, "TABLE_RETRY_S", 0.05)
    fake, calls = horovod(failures=10**9)
    with pytest.raises(ValueError, match="not been initialized"):
        dssync_groups.registered_sets(fake)
    assert len(calls) > 1
