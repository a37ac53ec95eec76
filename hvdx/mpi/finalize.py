"""``MPI_Finalize`` that does not deadlock over UCX's TCP transport (MPICH 4.0, 4.1).

MPICH's ``ch4:ucx`` finalize (4.0 and 4.1; Debian 12 ships 4.0.2) closes every
endpoint with a flush, makes progress until its own closes complete, and then waits for
the other ranks in a PMI barrier, where it makes no progress at all. Over UCX's TCP
transport a flush needs the peer's answer: after a message on an endpoint, the flush
sends a request (an empty PUT) that the peer acknowledges only from inside its own UCX
progress. A rank whose closes complete sits down in the barrier, and a request that
reaches it after that is never answered: its sender spins in ``MPI_Finalize`` forever,
the rank waits in the barrier forever, and a job that printed its result never exits.
Two orders lead there:

- a rank enters ``MPI_Finalize`` while a peer is still inside an MPI call (the root of
  a last gather, a rank whose last barrier message is late, Horovod's background thread
  shutting down): the peer answers the rank's request, the rank's closes complete, and
  the peer's own request, sent when it finalizes in turn, finds the rank in the barrier;
- a rank sent to a peer that never sent to it (a ring allgather's one direction): the
  peer's close of that endpoint has nothing to flush, so the peer need not wait for the
  rank at all, and leaves for the barrier before a late rank's request arrives.

On one host UCX moves the bytes through shared memory, whose flush needs no answer; the
emulated cluster forces ``UCX_TLS=tcp,self`` (:mod:`hvdx.cluster.launch`), so its jobs
meet this, and more often on a loaded machine, where ranks reach finalize further
apart. (MPICH 4.2 moved the PMI barrier before the closes.)

:func:`finalize` closes both doors from outside. Every rank first exchanges one byte
with every other rank, so that each rank has something to flush towards each peer and
none finishes its closes before every peer's request has reached it; then a PMI barrier,
which makes no MPI progress; then ``MPI_Finalize`` at once, so that no rank answers a
request before it has sent its own. The jobs hvdx launches on the emulated cluster (its
tests' jobs, the benchmark's runs and calibration) call it as their last MPI call, after
Horovod's shutdown, and then leave with ``os._exit``. It is not installed at interpreter
exit: objects torn down after it (requests, windows, threads of the user's script)
could still call into MPI, which MPICH refuses once finalized.

Standard library only at import; mpi4py is imported when finalizing.
"""

from __future__ import annotations

import os
import sys

__all__ = ["finalize", "pmi_barrier"]


def pmi_barrier() -> bool:
    """Wait in the process manager's barrier until every rank of the job is there.

    Speaks the PMI-1 wire protocol (``cmd=barrier_in`` / ``cmd=barrier_out``) on the
    connection Hydra hands each rank in ``PMI_FD``, the one MPICH's own PMI client uses;
    it must not be called while MPI is inside a PMI call (at the end of a job it is
    not). The barrier goes through Hydra's proxies, not through UCX, so a rank waiting
    in it answers no peer's flush.

    Returns:
        False (and waits for nothing) where there is no such connection: a singleton,
        or a launcher other than Hydra.

    Raises:
        RuntimeError: if the process manager answers something else or hangs up.
    """
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit():
        return False
    fd = int(fd)
    os.write(fd, b"cmd=barrier_in\n")
    reply = bytearray()
    while not reply.endswith(b"\n"):
        # One byte at a time: nothing past the reply is taken from MPICH's PMI reader.
        byte = os.read(fd, 1)
        if not byte:
            raise RuntimeError("the process manager closed the PMI connection in a barrier")
        reply += byte
    if not reply.startswith(b"cmd=barrier_out"):
        raise RuntimeError(f"unexpected PMI reply to barrier_in: {bytes(reply)!r}")
    return True


def finalize() -> None:
    """Every rank's last MPI call (collective): under MPICH, a byte to and from every
    other rank and a PMI barrier; then ``MPI_Finalize``.

    Call it after the process's last MPI operation, Horovod's shutdown included (its
    background thread communicates until then). Does nothing if mpi4py did not
    initialise MPI or MPI is finalised already.
    """
    MPI = sys.modules.get("mpi4py.MPI")  # importing it would initialise MPI
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if "MPICH" in MPI.Get_library_version():
        _exchange_with_every_rank(MPI)
        pmi_barrier()
    MPI.Finalize()


def _exchange_with_every_rank(MPI) -> None:
    """One byte from every rank to every other rank of ``MPI_COMM_WORLD``, on a
    communicator of its own (no user message can match)."""
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    peers = [p for p in range(size) if p != rank]
    inbox = bytearray(len(peers))
    outbox = bytearray(1)
    requests = [comm.Irecv(memoryview(inbox)[i:i + 1], source=p) for i, p in enumerate(peers)]
    requests += [comm.Isend(outbox, dest=p) for p in peers]
    MPI.Request.Waitall(requests)
    comm.Free()
