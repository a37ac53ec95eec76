"""Check a :class:`~hvdx.core.fingerprint.Fingerprint` across ranks, never hanging.

Every rank takes part in the same two collectives whatever its fingerprint holds, so a
disagreement cannot leave one rank waiting: all ranks learn of it together and raise the
same ``ValueError``.
"""

from __future__ import annotations

from mpi4py import MPI

from typing import Iterable, List, Optional, Tuple

from hvdx.core.fingerprint import Fingerprint, first_difference, first_error
from hvdx.strategy_contract import Job, Resolved, Setting, Strategy, resolve

__all__ = ["check_consistent", "resolve_checked"]


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


def resolve_checked(strategy: Optional[Strategy], job: Job, settings: List[Setting],
                    comm: Optional[MPI.Comm], what: str,
                    parameters: Iterable[Tuple[str, str, tuple]] = (),
                    more_settings: Iterable[Setting] = (),
                    kept: Optional[Exception] = None) -> Tuple[Resolved, List[Setting]]:
    """An entry point's strategy, resolved between two cross-rank checks (collective).

    1. check ``settings`` (the entry point's, with ``kept``: an error this rank kept for
       the check, as ``<what>.error``): preparing a strategy may be collective (DS-Sync
       detects the topology), so every rank must first know that all hold the same,
       valid spec; then raise ``kept`` (every rank kept the same);
    2. resolve the strategy (:func:`hvdx.strategy_contract.resolve`);
    3. check ``parameters`` with every setting (the resolution's, ``more_settings``);
    4. raise the resolution's error, on every rank alike.

    ``comm=None``: this rank is outside the ranks that must agree; it checks nothing.

    Returns:
        the resolution, and every setting (for a later check of the same job).
    """
    settings = list(settings)
    if kept is not None:
        settings.append((f"{what}.error", str(kept)))
    if comm is not None:
        check_consistent(Fingerprint.build(settings=settings), comm, what)
    if kept is not None:
        raise kept
    resolved = resolve(strategy, job)
    settings += resolved.settings + list(more_settings)
    if comm is not None:
        check_consistent(Fingerprint.build(parameters=parameters, settings=settings), comm,
                         what)
    resolved.raise_error()
    return resolved, settings
