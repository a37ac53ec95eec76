"""Building a Stanza trainer, the same for every framework: the ranks agree before training.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) splits the ranks into conv workers and FC
workers (:mod:`hvdx.strategies.stanza.core_roles`). Every check at construction ends in an
agreement, so that a bad argument or a model that differs between ranks raises the
same ``ValueError`` on every rank instead of leaving some waiting in a step:

1. :func:`agree_on_arguments`: each rank's model (``(name, dtype, shape)`` per
   parameter) and settings, and its local argument error if any, go into one
   fingerprint that every rank compares (:func:`hvdx.mpi.check_consistent`); a rank
   that failed, or was given other arguments, fails every rank alike;
2. with ``fc_workers="auto"``, :func:`probe_roles`: each rank times both parts forward
   and backward (:func:`hvdx.strategies.stanza.core_checks.timed`) at every head batch size an
   ``F`` could give (:func:`hvdx.strategies.stanza.core_roles.probe_counts`); the ranks agree on
   the median of each figure and choose ``F``
   (:func:`hvdx.strategies.stanza.mpi_exchange.agree_on_probe`); rank 0 prints the figures and
   the choice.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from mpi4py import MPI

from hvdx.core.fingerprint import Fingerprint
from hvdx.strategies.stanza.core_roles import StanzaRoles, probe_counts, stanza_roles
from hvdx.mpi import check_consistent
from hvdx.strategies.stanza.core_checks import timed
from hvdx.strategies.stanza.mpi_exchange import agree_on_probe

__all__ = ["agree_on_arguments", "probe_roles"]


def agree_on_arguments(comm: MPI.Comm, entries: Iterable[Tuple[str, str, Sequence[int]]],
                       settings: List[Tuple[str, object]], error: Optional[Exception],
                       labels: Sequence[str] = ()) -> None:
    """Step 1 (collective): raises the same ``ValueError`` on every rank if the ranks'
    models or settings differ, else this rank's own ``error`` if it has one (then every
    rank has one: the errors are part of the fingerprint)."""
    settings = list(settings)
    if error is not None:
        settings.append(("stanza.error", f"{type(error).__name__}: {error}"))
    check_consistent(Fingerprint.build(entries if error is None else (), settings,
                                       labels=labels if error is None else ()),
                     comm, "Stanza")
    if error is not None:
        raise error


def probe_roles(comm: MPI.Comm, batch: int, example: str,
                prepare: Callable[[], Tuple[Callable[[], object],
                                            Callable[[int], Callable[[], object]]]]
                ) -> Tuple[StanzaRoles, Dict[str, object]]:
    """Step 2 (collective): ``(roles, probe)``, the same on every rank.

    Args:
        batch: the example's samples.
        example: the example in words, for the message if it does not go through.
        prepare: returns ``(conv, fc)``: ``conv()`` runs the features forward and
            backward on the example, ``fc(count)`` a function that runs the head
            forward and backward on ``count`` samples.

    Raises:
        ValueError: on every rank, the first failing rank's message, if the example
            does not go through the model on some rank.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    figures, error = None, None
    try:
        conv, fc = prepare()
        figures = (timed(conv), {count: timed(fc(count)) for count in probe_counts(size, batch)})
    except Exception as exc:  # whatever the user's model raises on the example
        error = (f"Stanza fc_workers='auto': rank {rank}'s example ({example}) does not go "
                 f"through features and head: {type(exc).__name__}: {exc}")
    probe = agree_on_probe(comm, batch, figures, error)
    roles = stanza_roles(size, probe["fc_workers"])
    if rank == 0:
        head_ms = ", ".join(f"{count} samples {1e3 * t:.1f} ms"
                            for count, t in probe["head_s"].items())
        print(f"[hvdx] Stanza fc_workers='auto': features {1e3 * probe['conv_s']:.1f}"
              f" ms per batch of {batch}, head {head_ms} (forward + backward, "
              f"median over ranks): {roles.fc_workers} FC worker(s) of {size} ranks",
              file=sys.stderr, flush=True)
    return roles, probe
