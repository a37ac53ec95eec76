"""Each rank of a benchmark job on one core: ``python -m hvdx.bench.pinning CMD ...``.

The benchmark emulates a cluster on one machine, where its ranks (four on the default
2 x 2 cluster) outnumber the cores (two on the machines it was measured on). Left to
the scheduler, the same run was far from steady: on 2 cores, three runs of one command
back to back (digits_cnn, Horovod, four ranks on this host) read 55, 36 and 92 ms per
step; DS-Sync on the emulated cluster fell, in two runs of two, into stretches of 40
steps at 100-280 ms where its other steps took about 45 (its rack average, 150 KB over
a 1 Gbit link, then took 92 ms). With every rank bound to one core, rank ``r`` to
core ``r mod cores``, the same three Horovod runs read 40, 48 and 52 ms and DS-Sync
kept 45-46 ms in both runs (2026-12-07).

1. the harness (:mod:`hvdx.bench.strategy_run`, :mod:`hvdx.bench.calibration_jobs`)
   starts every rank of its jobs (the runs, a ``--script``'s, the calibration) through
   this module, with :data:`PIN_ENV` set to the cores it may use itself
   (:func:`cores_value`);
2. the rank binds itself (:func:`pin_rank`): its rank from the MPI launcher's
   variables (:data:`RANK_VARIABLES`), its core the ``rank mod len(cores)``-th;
3. it then becomes the command (``exec``), before MPI or Horovod start a thread: theirs
   inherit the core. The emulated hosts' network namespaces do not change the cores.
Without :data:`PIN_ENV` nothing is pinned.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Mapping, Optional

__all__ = ["PIN_ENV", "RANK_VARIABLES", "command", "cores_value", "pin_rank"]

#: Comma-separated cores, e.g. ``"0,1"``: the ranks of the job are spread over them.
PIN_ENV = "HVDX_BENCH_PIN_CORES"
#: Where MPI launchers put a process's rank before MPI is initialised: MPICH's Hydra,
#: Open MPI, PMIx.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def cores_value() -> str:
    """:data:`PIN_ENV`'s value for the cores this process may run on."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every core the machine has
        cores = list(range(os.cpu_count() or 1))
    return ",".join(map(str, cores))


def pin_rank(environ: Optional[Mapping[str, str]] = None,
             set_affinity: Optional[Callable[[int, set], None]] = None) -> Optional[int]:
    """Binds this process to its core (module steps 2-3); the core, or ``None`` when
    nothing was asked or the rank is not known.

    Raises:
        ValueError: :data:`PIN_ENV` is set but is not a list of core numbers.
    """
    environ = os.environ if environ is None else environ
    value = environ.get(PIN_ENV, "").strip()
    if not value:
        return None
    try:
        cores = [int(c) for c in value.split(",")]
    except ValueError:
        raise ValueError(f"{PIN_ENV}={value!r} must be core numbers separated by commas, "
                         "e.g. 0,1") from None
    if not cores or min(cores) < 0:
        raise ValueError(f"{PIN_ENV}={value!r} must be core numbers separated by commas, "
                         "e.g. 0,1")
    rank = next((environ[v] for v in RANK_VARIABLES if environ.get(v, "").isdigit()), None)
    if rank is None:
        return None
    core = cores[int(rank) % len(cores)]
    setter = set_affinity or getattr(os, "sched_setaffinity", None)
    if setter is None:  # not Linux: the scheduler places the rank
        return None
    setter(0, {core})
    return core


def command(argv) -> list:
    """``argv`` started through this module (module step 1)."""
    return [sys.executable, "-m", __name__] + list(argv)


def main(argv=None) -> None:
    """Pins this rank, then runs ``argv`` in its place (module steps 2-3)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        raise SystemExit("usage: python -m hvdx.bench.pinning COMMAND [ARGS...]")
    pin_rank()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
