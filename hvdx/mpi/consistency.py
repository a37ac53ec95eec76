"""Check a :class:`~hvdx.core.fingerprint.Fingerprint` across ranks, never hanging.

Every rank takes part in the same two collectives whatever its fingerprint holds, so a
disagreement cannot leave one rank waiting: all ranks learn of it together and raise the
same ``ValueError``.
"""

from __future__ import annotations

from mpi4py import MPI

from hvdx.core.fingerprint import Fingerprint, first_difference, first_error

__all__ = ["check_consistent"]


def check_consistent(fingerprint: Fingerprint, comm: MPI.Comm, what: str) -> None:
    """Raise the same ``ValueError`` on every rank of ``comm`` if fingerprints differ.

    Args:
        fingerprint: this rank's fingerprint.
        comm: the ranks that must agree (all call this function).
        what: the object being built, for the message (``"DistributedOptimizer"``).
    """
    digests = comm.allgather(fingerprint.digest())
    if len(set(digests)) == 1:
        return
    everyone = comm.allgather(fingerprint)
    error = first_error(everyone)
    if error is not None:
        raise ValueError(f"hvdx {what}: {error} (every rank must pass the same, valid "
                         "settings)")
    detail = first_difference(everyone) or "fingerprints differ"
    raise ValueError(
        f"hvdx {what}: ranks disagree: {detail}. Every rank must build the same model "
        "(same parameters in the same order, same shapes and dtypes) and pass the same "
        "settings.")
