"""The mpi4py layer: communicators that match Horovod's, and hvdx's own exchanges.

``mpi4py.MPI`` is imported here before Horovod is, so that MPI is initialised by mpi4py
with ``MPI_THREAD_MULTIPLE`` and Horovod's background thread and hvdx's point-to-point
traffic can share the process (see ``docs`` in the README).
"""

from hvdx.mpi.abort import install_abort_on_error, wrap_init
from hvdx.mpi.comm import communicator_for
from hvdx.mpi.consistency import check_consistent

__all__ = ["communicator_for", "check_consistent", "install_abort_on_error", "wrap_init"]
