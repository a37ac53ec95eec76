"""How the benchmark launches a strategy: its environment is its job's."""

import sys

import pytest

from hvdx.bench.strategy_run import launch_command
from hvdx.bench.pinning import PIN_ENV, cores_value
from hvdx.bench.strategies import STRATEGIES
from hvdx.strategies.topk.bench_rows import TOPK_DGC_OPTIONS, TOPK_MASKED_OPTIONS

pytestmark = [pytest.mark.topk, pytest.mark.decentralized, pytest.mark.stanza]


def test_on_localhost_a_strategys_environment_is_given_to_mpirun():
    command, env = launch_command(None, 1, ["prog"], 2, {"HOROVOD_CYCLE_TIME": "50"})
    # Each rank starts through the pinning module, which binds it to one core.
    assert command == ["mpirun", "-n", "2", sys.executable, "-m", "hvdx.bench.pinning", "prog"]
    assert env == {"OMP_NUM_THREADS": "1", PIN_ENV: cores_value(), "HOROVOD_CYCLE_TIME": "50"}


def test_every_run_keeps_horovods_defaults_as_the_baseline_does():
    # A longer cycle would give the strategies that leave Horovod idle during a step
    # (the tuned TopKs, decentralized SGD, Stanza) CPU the baseline does not get.
    assert {name: s.env for name, s in STRATEGIES.items()
            if any(k.startswith("HOROVOD_") for k in s.env)} == {}
    for name in ("decentralized", "decentralized_static", "decentralized_cta"):
        assert "global_every" not in STRATEGIES[name].cost_options
    assert TOPK_DGC_OPTIONS["small_tensors"] == TOPK_MASKED_OPTIONS["small_tensors"] == \
        "in_topk_step"
