"""What hvdx prints on standard error about a job's strategies, and ``HVDX_LOG_LEVEL``,
which chooses how much.

An entry point (``DistributedOptimizer`` of torch and Keras, ``DistributedGradientTape``)
that takes an hvdx strategy has rank 0 say which, once per entry point and setting,
whether the strategy came from the code or from ``HVDX_COMPRESSION`` / ``HVDX_SYNC``
(:mod:`hvdx.environment`)::

    [hvdx] compression in the code: bidirectional TopK, ratio=0.01 ... (DistributedOptimizer)
    [hvdx] HVDX_SYNC='DSSync()': DS-Sync, DSSync(...) (DistributedOptimizer)

``HVDX_LOG_LEVEL`` (read here only, at every line, so a test or notebook may change it):

- ``info`` (the default): those lines, and hvdx's warnings (a variable ignored because
  the code passes the argument);
- ``warning``: the warnings only; ``error``: neither;
- ``debug``: as ``info``, and every rank prints the lines rank 0 prints, prefixed with its
  rank, to check that each rank took the same strategy.

Case is ignored; another value is taken as ``info``, and rank 0 says so once.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

__all__ = ["LEVELS", "LEVEL_VARIABLE", "enabled", "level", "say"]

LEVEL_VARIABLE = "HVDX_LOG_LEVEL"

#: Accepted values, quietest last.
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_DEFAULT = "info"
_warned = set()


def level() -> str:
    """``HVDX_LOG_LEVEL``, lower-cased; ``info`` if unset, empty or not one of
    :data:`LEVELS` (rank 0 says so, once per value)."""
    raw = os.environ.get(LEVEL_VARIABLE, "")
    value = raw.strip().lower() or _DEFAULT
    if value in LEVELS:
        return value
    if raw not in _warned:
        _warned.add(raw)
        if _rank() == 0:
            print(f"[hvdx] {LEVEL_VARIABLE}={raw!r} is not one of "
                  f"{', '.join(LEVELS)}; hvdx logs at {_DEFAULT}", file=sys.stderr,
                  flush=True)
    return _DEFAULT


def enabled(severity: str) -> bool:
    """Whether a line of ``severity`` (a key of :data:`LEVELS`) is printed."""
    return LEVELS[severity] >= LEVELS[level()]


def say(text: str, severity: str = "info", rank: Optional[int] = None) -> None:
    """``[hvdx] text`` on standard error, on rank 0, if ``severity`` is enabled; at
    ``debug``, on every other rank too, as ``[hvdx rank N] text``.

    Args:
        rank: this process's rank among the ranks that say ``text``; ``None``: its rank
            in ``MPI.COMM_WORLD`` (0 without MPI).
    """
    if not enabled(severity):
        return
    rank = _rank() if rank is None else rank
    if rank == 0:
        prefix = "[hvdx]"
    elif enabled("debug"):
        prefix = f"[hvdx rank {rank}]"
    else:
        return
    print(f"{prefix} {text}", file=sys.stderr, flush=True)


def _rank() -> int:
    """This process's rank in ``MPI.COMM_WORLD`` (0 without MPI)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0
    return mpi.COMM_WORLD.Get_rank()
