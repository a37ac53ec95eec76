"""hvdx's read of Horovod's process-set table (``registered_sets``): Horovod reads it
without its lock, so a set being set up or torn down makes the read fail for a moment
with "not initialized properly"; hvdx reads again while Horovod is initialized, and
never reads the global set, whose read Horovod 0.28.1 was seen to fail for seconds."""

import types

import pytest

from hvdx.strategies.dssync import mpi_groups as dssync_groups

pytestmark = [pytest.mark.dssync]


class Library:
    """Horovod's C API for its process-set table, over ``{id: ranks}``; the ranks read
    of set 3 fails ``failures`` times first, as a set being torn down does, and the
    global set's always fails (as Horovod 0.28.1 was seen to do after sets were
    removed): hvdx never reads it."""

    def __init__(self, table, failures):
        self.table, self.failures, self.calls = table, failures, []

    def horovod_number_of_process_sets(self):
        return len(self.table)

    def horovod_process_set_ids(self, out):
        for i, key in enumerate(self.table):
            out[i] = key

    def horovod_process_set_size(self, process_set_id):
        return len(self.table[process_set_id.value])

    def horovod_process_set_ranks(self, process_set_id, out):
        process_set_id = process_set_id.value
        if process_set_id == 0:
            return -1
        self.calls.append(process_set_id)
        if len(self.calls) <= self.failures:
            return -1
        for i, rank in enumerate(self.table[process_set_id]):
            out[i] = rank
        return 0


def horovod(failures, initialized=True):
    """A stand-in Horovod whose table read fails ``failures`` times first."""
    library = Library({0: [0, 1, 2, 3], 3: [0, 1]}, failures)

    class ProcessSet:
        def __init__(self, ranks):
            self.ranks = ranks

    fake = types.SimpleNamespace(
        mpi_ops=types.SimpleNamespace(_basics=types.SimpleNamespace(
            MPI_LIB_CTYPES=library, HOROVOD_PROCESS_SET_ERROR_INIT=-1)),
        is_initialized=lambda: initialized, ProcessSet=ProcessSet)
    return fake, library.calls


def test_a_read_that_fails_for_a_moment_is_read_again():
    fake, calls = horovod(failures=3)
    sets = dssync_groups.registered_sets(fake)
    assert list(sets) == [(0, 1)] and sets[(0, 1)].process_set_id == 3
    assert len(calls) == 4


def test_horovod_shut_down_is_said_at_once():
    fake, calls = horovod(failures=1, initialized=False)
    with pytest.raises(ValueError, match=r"not been initialized.*is_initialized\(\)=False"):
        dssync_groups.registered_sets(fake)
    assert len(calls) == 2  # one read, not read again; one more for the message's table


def test_a_table_that_never_reads_fails_after_the_retry_time(monkeypatch):
    monkeypatch.setattr(dssync_groups, "TABLE_RETRY_S", 0.05)
    fake, calls = horovod(failures=10**9)
    with pytest.raises(ValueError, match="not been initialized"):
        dssync_groups.registered_sets(fake)
    assert len(calls) > 1
