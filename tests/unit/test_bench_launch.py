"""How the benchmark launches a strategy: its environment is its job's."""

from hvdx.bench.harness import _launch_command
from hvdx.bench.strategies import STRATEGIES, TOPK_DGC_OPTIONS, TOPK_MASKED_OPTIONS


def test_on_localhost_a_strategys_environment_is_given_to_mpirun():
    command, env = _launch_command(None, 1, ["prog"], 2, {"HOROVOD_CYCLE_TIME": "50"})
    assert command == ["mpirun", "-n", "2", "prog"]
    assert env == {"OMP_NUM_THREADS": "1", "HOROVOD_CYCLE_TIME": "50"}


def test_only_strategies_that_leave_horovod_idle_during_a_step_lengthen_its_cycle():
    # A longer cycle delays every collective Horovod runs: it costs nothing only where
    # Horovod carries nothing during a step (TopK with small_tensors="in_topk_step"; decentralized
    # SGD, whose exchange is mpi4py point-to-point, with global_every=0; Stanza, whose
    # messages are mpi4py too; the floor, which communicates not at all).
    slow = {name for name, s in STRATEGIES.items() if "HOROVOD_CYCLE_TIME" in s.env}
    assert slow == {"topk_dgc", "topk_masked", "decentralized", "decentralized_static",
                    "decentralized_cta", "stanza", "stanza_f2", "stanza_auto",
                    "stanza_micro", "floor"}
    for name in ("decentralized", "decentralized_static", "decentralized_cta"):
        assert "global_every" not in STRATEGIES[name].cost_options
    assert TOPK_DGC_OPTIONS["small_tensors"] == TOPK_MASKED_OPTIONS["small_tensors"] == \
        "in_topk_step"
