"""One row of ``hvdx bench``'s table, :class:`BenchRow`, and what the rows share.

The table itself (:data:`hvdx.bench.strategies.STRATEGIES`) is built from the strategy
catalogue; each built-in strategy's rows are made in its own folder
(``hvdx/strategies/<name>/bench_rows.py``), which imports the row's type and the shared
helpers from here, not from the table's module: importing a strategy's rows first would
otherwise build the table, which loads those same rows half imported.

Horovod's own collectives are not visible to hvdx, so the bytes of an allreduce are the
standard cost of the algorithm MPI runs for a large one (reduce-scatter + allgather,
Thakur, Rabenseifner & Gropp 2005): each rank sends ``2 (n - 1) / n`` times the buffer
(:func:`allreduce_bytes_per_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

__all__ = ["BenchRow", "allreduce_bytes_per_rank", "call", "counted_bytes"]


def allreduce_bytes_per_rank(nbytes: int, size: int) -> float:
    """Bytes one rank sends in a bandwidth-optimal allreduce of ``nbytes`` over ``size``."""
    return 0.0 if size <= 1 else 2.0 * (size - 1) / size * nbytes


@dataclass(frozen=True)
class BenchRow:
    """How to build the optimizer, and the bytes a rank sends per step."""

    name: str
    label: str
    build: Callable  # (optimizer, model) -> distributed optimizer
    #: (distributed optimizer, model, size, steps) -> (sent, received) bytes per rank per
    #: step, read after training.
    bytes_per_step: Callable
    cost_model: Optional[str] = None  # its name in hvdx.core.cost_model, if priced there
    cost_options: Dict = field(default_factory=dict)
    #: (distributed optimizer) -> cost options read off the run (override cost_options).
    cost_options_of: Optional[Callable] = None
    #: (distributed optimizer) -> the steps after which the strategy's communication
    #: repeats (a DS-Sync rotation, a one-peer graph), or ``None``: every step alike,
    #: or no period (a shuffle). The bench's mean step covers whole periods.
    period_of: Optional[Callable] = None
    init_kwargs: Dict = field(default_factory=dict)  # for hvd.init
    #: Environment variables of the strategy's MPI job (every rank), e.g. Horovod's.
    env: Dict[str, str] = field(default_factory=dict)
    #: Run by a plain ``hvdx bench`` (others only when named in ``--strategies``).
    default: bool = True
    #: (distributed optimizer, steps) -> dict of figures read once after training, on
    #: every rank (a collective may run here), after the interface counters are read;
    #: rank 0 records them as the run's ``final_stats``.
    final_stats: Optional[Callable] = None
    #: (distributed optimizer) -> None, run inside the step's clock when an evaluation
    #: follows the step: completes communication a strategy leaves in flight past
    #: ``step()``, which the evaluation's forward pass would otherwise wait for off the
    #: clock (decentralized SGD's exchange).
    before_eval: Optional[Callable] = None
    #: A strategy whose ranks have roles (Stanza): ``build`` is then
    #: ``(optimizer, model, example) -> trainer`` and the runner drives
    #: ``trainer.step(x, y)`` on the conv workers and ``trainer.step()`` on the others
    #: (:mod:`hvdx.bench.runner`); ``bytes_per_step`` and the other callables get the
    #: trainer in place of the optimizer.
    roles: bool = False
    #: Run by ``hvdx bench --full`` too, where not :attr:`default`.
    full: bool = False
    #: Other names ``--strategies`` accepts for it (:data:`ALIASES`).
    aliases: tuple = ()
    #: ``hvdx bench --script``: the variables (``HVDX_COMPRESSION`` or ``HVDX_SYNC``)
    #: that switch an unchanged script to it, as :mod:`hvdx.environment` spells them
    #: (``{}``: Horovod's own); ``None`` where no variable can (:attr:`needs_code`).
    script_env: Optional[Dict[str, str]] = None
    #: Why a script cannot run it unchanged, where :attr:`script_env` is ``None``.
    needs_code: Optional[str] = None
    #: The catalogue's name of the strategy it is a row of (``None``: the baseline and
    #: the floor).
    strategy: Optional[str] = None
    #: (workload) -> the settings the row runs with on that workload, compared with
    #: ``==``; ``None``: not compared. Two rows whose settings are equal on a workload
    #: are one run there, measured once (:func:`hvdx.bench.run_list.same_settings`).
    settings_on: Optional[Callable] = None


def call(name: str, options: Dict) -> str:
    """``name(k=v, ...)``: a constructor's call as the variables spell it."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in options.items())})"


def counted_bytes(optimizer, model, size, steps):
    """hvdx's own traffic: the byte counters of the optimizer, per step."""
    stats = optimizer.hvdx_stats
    return stats.total_sent / steps, stats.total_received / steps
