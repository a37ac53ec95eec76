"""A fifth built-in strategy for the tests, laid out as a strategy's folder
(``hvdx/strategies/<name>/``) is, in one module: its spec and mixer (``spec.py``,
``mixer.py``), its cost layout (``core_cost.py``), its bench rows (``bench_rows.py``),
its plan line (``plan_line.py``) and its catalogue entry (``descriptor.py``).

tests/unit/test_strategy_catalogue.py adds :data:`FIFTH` to the catalogue and checks
that every view of the catalogue shows it, with no other edit. Its lazy paths name this
module (``fifth_strategy:Fifth``), which pytest finds beside the tests.

The strategy: every ``level``-th step averages the parameters over every rank (the
mixing matrix of all ``1/n``); the steps between are local.
"""

from typing import Dict

import numpy as np

from hvdx.bench.strategy_row import BenchRow, call
from hvdx.core.cost.types import _Plan
from hvdx.core.mixer_protocol import Mixer
from hvdx.core.validation import check_integer
from hvdx.strategies.descriptor import (BenchVariant, Constructor, PlanOption,
                                        StrategyDescriptor)
from hvdx.strategy_contract import MixingStrategy, validating


# --- mixer.py ----------------------------------------------------------------------

def fifth_matrix(size: int) -> np.ndarray:
    """The matrix a mixing step applies: everyone's mean (exported by both frameworks'
    modules, as a strategy's helper such as ``dssync_process_sets`` is)."""
    return np.full((size, size), 1.0 / size)


class FifthMixer(Mixer):
    """Everyone's mean every ``level``-th step, the identity between."""

    def __init__(self, level: int):
        self.level = level

    def matrix(self, step: int, size: int) -> np.ndarray:
        return fifth_matrix(size) if (step + 1) % self.level == 0 else np.eye(size)

    def settings(self) -> Dict[str, object]:
        return {"level": self.level}


# --- spec.py -----------------------------------------------------------------------

class Fifth(MixingStrategy):
    """``sync=hvdx.Fifth(level=2)``: mix (average over every rank) every ``level``-th
    step."""

    name = "fifth"

    @validating
    def __init__(self, level=1, global_every=0):
        self.level = check_integer("level", level, 1)
        self._init_mixing(global_every=global_every)

    def fingerprint_settings(self, job, setup):
        return [("fifth.level", self.level), ("fifth.global_every", self.global_every)]

    def describe(self) -> str:
        return f"fifth level={self.level}"

    def make_mixer(self, setup) -> FifthMixer:
        return FifthMixer(self.level)


# --- core_cost.py ------------------------------------------------------------------

def fifth_layout(c, w, fifth_level=1):
    """The cost model's layout: no traffic priced, a step of ``fifth_level`` computes
    (a stand-in the test can tell apart)."""
    return _Plan(f"fifth level {fifth_level}", [], compute_s=w.compute_s * fifth_level)


# --- bench_rows.py -----------------------------------------------------------------

def _fifth_with(level: int):
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        sync=Fifth(level=level))
    return build


def _mixed_bytes(optimizer, model, size, steps):
    each_way = optimizer.hvdx_stats.total_bytes / steps
    return each_way, each_way


def fifth_strategy(name: str, level: int = 1) -> BenchRow:
    """A row of ``hvdx bench``: Fifth at ``level``."""
    return BenchRow(name, f"fifth, level {level}", _fifth_with(level), _mixed_bytes,
                    cost_model="fifth", cost_options={"fifth_level": level},
                    script_env={"HVDX_SYNC": call("Fifth", {"level": level})})


# --- plan_line.py ------------------------------------------------------------------

def fifth_line(given, cluster) -> str:
    """Under ``hvdx plan``'s table, what a script writes to run it."""
    return f"sync=hvdx.Fifth(level={given['fifth_level']!r})"


# --- descriptor.py -----------------------------------------------------------------

FIFTH = StrategyDescriptor(
    name="fifth", kind="sync", title="Fifth",
    constructors=(Constructor("Fifth", "fifth_strategy:Fifth"),),
    examples=("Fifth(level=2)",), cost_model="fifth",
    cost_layout="fifth_strategy:fifth_layout", cost_compared=({}, {"fifth_level": 2}),
    torch_exports=("fifth_strategy:fifth_matrix",),
    tensorflow_exports=("fifth_strategy:fifth_matrix",),
    bench=(BenchVariant("fifth", "fifth_strategy:fifth_strategy"),
           BenchVariant("fifth_high", "fifth_strategy:fifth_strategy", {"level": 9},
                        default=False, aliases=("high",))),
    soak="Fifth(level=2)", plan_line="fifth_strategy:fifth_line",
    plan_options=(PlanOption("--fifth-level", int, "fifth: level", 1),))
