"""Which runs a bench makes, and in what order: Horovod and the floor first, then every
other strategy under each rank placement (:func:`ordered_runs`), the placements and
workloads checked, and the (workload, strategy) pairs that are not run, and why
(:func:`not_applicable`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

from hvdx.bench.strategies import STRATEGIES
from hvdx.bench.summary import FLOOR
from hvdx.bench.workloads import WORKLOADS

__all__ = ["check_placements", "not_applicable", "ordered_runs", "same_settings",
           "with_data"]


def ordered_runs(strategies: List[str], placements: List[str], floor: bool = True) -> List[tuple]:
    """``(strategy, placement)`` in run order: Horovod under the first placement, the
    floor there too (unless ``floor`` is false), then every other strategy under each
    placement."""
    runs = [("horovod", placements[0])]
    if floor:
        runs.append((FLOOR, placements[0]))
    for placement in placements:
        runs += [(s, placement) for s in strategies if s not in ("horovod", FLOOR)]
    return runs


def check_placements(placements: List[str]) -> List[str]:
    """The ``--placement`` list, checked (each of :data:`PLACEMENTS`, no repeats)."""
    from hvdx.core.cost_model import PLACEMENTS

    if not placements:
        raise ValueError("--placement='' names no placement")
    for p in placements:
        if p not in PLACEMENTS:
            raise ValueError(f"--placement={p!r} is unknown; choose from "
                             f"{', '.join(PLACEMENTS)}")
    if len(set(placements)) != len(placements):
        raise ValueError(f"--placement={','.join(placements)!r} names a placement twice")
    return list(placements)


def with_data(workloads: List[str], say: Callable[[str], None]) -> List[str]:
    """The workloads whose data is on this machine (:meth:`Workload.check_data`), in
    order; each missing one is said with what to install, and the rest still run."""
    ready = []
    for w in workloads:
        try:
            WORKLOADS[w].check_data()
        except (ImportError, RuntimeError) as e:  # DataMissing, CorpusMissing
            say(f"{w}: left out: {e}")
            continue
        ready.append(w)
    if not ready:
        raise RuntimeError(f"none of --workloads={','.join(workloads)} has its data on "
                           f"this machine (see above)")
    return ready


def not_applicable(workloads: Sequence[str], strategies: Sequence[str]) -> List[str]:
    """One line per (workload, strategy) pair that does not run, and why."""
    return ([f"{w}: {s} does not apply: {WORKLOADS[w].does_not_apply[s]}"
             for w in workloads for s in strategies if s in WORKLOADS[w].does_not_apply] +
            [f"{w}: {s} is not run: its settings there are {first}'s ({settings}); see "
             f"{first}'s row"
             for (w, s), (first, settings) in same_settings(workloads, strategies).items()])


def same_settings(workloads: Sequence[str], strategies: Sequence[str]
                  ) -> Dict[Tuple[str, str], Tuple[str, object]]:
    """``(workload, strategy) -> (the earlier strategy, the settings both run)`` for each
    strategy whose settings on the workload
    (:attr:`~hvdx.bench.strategy_row.BenchRow.settings_on`) equal an earlier one's in
    ``strategies``: both presets under an adaptive optimizer, for example. The run would
    repeat the earlier one, so it is measured once."""
    same: Dict[Tuple[str, str], Tuple[str, object]] = {}
    for w in workloads:
        seen: List[Tuple[str, object]] = []
        for s in strategies:
            row = STRATEGIES.get(s)
            if row is None or row.settings_on is None or s in WORKLOADS[w].does_not_apply:
                continue
            settings = row.settings_on(WORKLOADS[w])
            first = next((name for name, other in seen if other == settings), None)
            if first is None:
                seen.append((s, settings))
            else:
                same[w, s] = (first, settings)
    return same

