"""TopK chosen by ``HVDX_COMPRESSION`` for an unchanged Horovod script (torch).

The variable is set on every rank inside the test (``hvdx_variables``) before the
optimizer is built, as ``mpirun -genv`` would set it. The reference is the same
strategy passed in code, or Horovod's own optimizer.
"""

import pathlib
import sys

import horovod.torch
import pytest
import torch
import torch.nn.functional as F

import hvdx.torch as hvd
from hvdx import environment
from hvdx.environment_variables import VariableError
from hvdx.mpi.init_environment import init_arguments
from torch_models import SmallCNN, batches

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402
from mpi4py import MPI  # noqa: E402

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the environment switch: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]


def trained(make=hvd.DistributedOptimizer, steps=3, **arguments):
    """The optimizer and the parameters after ``steps`` steps of SmallCNN (momentum SGD,
    the same start on every rank, different data per rank)."""
    torch.manual_seed(1)
    model = SmallCNN()
    optimizer = make(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                     named_parameters=model.named_parameters(), **arguments)
    for x, y in batches(hvd.rank(), steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return optimizer, [p.detach().clone() for p in model.parameters()]


def bitwise(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def refused_everywhere(compression, name):
    """The ``ValueError`` with which building the optimizer fails, after checking that
    every rank raised the same message and that no rank was left in a collective
    (``name``: the allreduce's, the same on every rank)."""
    with pytest.raises(ValueError) as info:
        with hvdx_variables(compression=compression):
            trained(steps=0)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{name}")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))
    return message


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, in_code", [
    ("topk(0.1, 0.1)", lambda: hvd.Compression.topk(0.1, 0.1)),
    ("fast", lambda: hvd.Compression.topk(preset="fast")),
    ("topk(preset='safe', ratio=0.2)", lambda: hvd.Compression.topk(0.2, preset="safe")),
    # the old spelling of topk_method and small_tensors
    ("topk(0.1, 0.1, selector='threshold', small_tensors='hvdx')",
     lambda: hvd.Compression.topk(0.1, 0.1, topk_method="sampled_threshold",
                                  small_tensors="in_topk_step")),
])
def test_a_topk_from_the_environment_trains_bitwise_like_the_same_topk_in_code(
        value, in_code):
    with hvdx_variables(compression=value):
        optimizer, from_environment = trained()
    _, from_code = trained(compression=in_code())
    assert optimizer._hvdx_sync.compression == in_code()
    assert bitwise(from_environment, from_code)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value", [None, "none", ""])
def test_unset_or_none_is_horovods_own_optimizer_bitwise(value):
    with hvdx_variables(compression=value, sync=value):
        optimizer, ours = trained()
    _, theirs = trained(horovod.torch.DistributedOptimizer)
    assert type(optimizer).__module__ == "horovod.torch.optimizer"
    assert bitwise(ours, theirs)


@pytest.mark.mpi(min_size=1)
def test_rank_zero_says_once_which_topk_the_environment_chose(capsys):
    with hvdx_variables(compression="topk(0.1, 0.1)"):
        trained(steps=0)
        trained(steps=0)
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx] HVDX_COMPRESSION=")]
    if hvd.rank() == 0:
        assert said == ["[hvdx] HVDX_COMPRESSION='topk(0.1, 0.1)': bidirectional TopK, "
                        "ratio=0.1 downlink=0.1 mode=auto min_size=1024 warmup_steps=0 "
                        "topk_method=exact sample_size=65536 seed=0 error_feedback=True "
                        "selection=layerwise (DistributedOptimizer)"]
    else:
        assert said == []


@pytest.mark.mpi(min_size=1)
def test_a_compression_in_the_code_wins_over_the_environment(capsys):
    with hvdx_variables(compression="topk(0.5)"):
        optimizer, _ = trained(steps=0, compression=hvd.Compression.topk(0.1))
        horovods, _ = trained(steps=0, compression=hvd.Compression.fp16)
    assert optimizer._hvdx_sync.compression == hvd.Compression.topk(0.1)
    assert type(horovods).__module__ == "horovod.torch.optimizer"
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx] HVDX_COMPRESSION=")]
    assert len(said) == (hvd.rank() == 0)
    assert all("'topk(0.5)': ignored: the code passes compression=unidirectional TopK, "
               "ratio=0.1 " in line for line in said)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("in_code", [False, True], ids=["environment", "code"])
def test_rank_zero_describes_a_preset_with_adam_without_momentum_correction(in_code,
                                                                            capsys):
    """The line that names the strategy gives the settings that run: under Adam a TopK
    preset drops DGC's momentum correction, so it says momentum_correction=False, never
    the preset's True next to the note that it was dropped."""
    def with_adam(optimizer, **arguments):
        return hvd.DistributedOptimizer(
            torch.optim.Adam(optimizer.param_groups[0]["params"], lr=0.01), **arguments)

    arguments = {"compression": hvd.Compression.topk(preset="fast")} if in_code else {}
    capsys.readouterr()
    with hvdx_variables(compression=None if in_code else "fast"):
        optimizer, _ = trained(with_adam, steps=0, **arguments)
    assert not optimizer._hvdx_sync.compression.momentum_correction
    said = [line for line in capsys.readouterr().err.splitlines() if "TopK, " in line]
    assert len(said) == (hvd.rank() == 0), said
    assert all(" momentum_correction=False " in line and
               "momentum_correction=True" not in line for line in said), said


CODE_TOPK_LINE = ("compression in the code: bidirectional TopK, ratio=0.1 downlink=0.1 "
                  "mode=auto min_size=1024 warmup_steps=0 topk_method=exact "
                  "sample_size=65536 seed=0 error_feedback=True selection=layerwise "
                  "(DistributedOptimizer)")


def said_about_the_code(capsys):
    return [line for line in capsys.readouterr().err.splitlines()
            if "compression in the code: " in line]


@pytest.mark.mpi(min_size=1)
def test_rank_zero_says_once_which_strategy_the_code_passes(capsys):
    with hvdx_variables():  # (forgets what earlier tests said)
        trained(steps=1, compression=hvd.Compression.topk(0.1, 0.1))
        trained(steps=1, compression=hvd.Compression.topk(0.1, 0.1))  # the same setting
    assert said_about_the_code(capsys) == \
        ([f"[hvdx] {CODE_TOPK_LINE}"] if hvd.rank() == 0 else [])


@pytest.mark.mpi(min_size=1)
def test_hvdx_log_level_warning_silences_what_runs(capsys, monkeypatch):
    monkeypatch.setenv("HVDX_LOG_LEVEL", "warning")
    with hvdx_variables(compression="topk(0.1, 0.1)"):
        trained(steps=0)
    with hvdx_variables():
        trained(steps=0, compression=hvd.Compression.topk(0.1, 0.1))
    assert [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx")] == []


@pytest.mark.mpi(min_size=1)
def test_hvdx_log_level_debug_has_every_rank_say_what_runs(capsys, monkeypatch):
    monkeypatch.setenv("HVDX_LOG_LEVEL", "debug")
    with hvdx_variables():
        trained(steps=0, compression=hvd.Compression.topk(0.1, 0.1))
    prefix = "[hvdx]" if hvd.rank() == 0 else f"[hvdx rank {hvd.rank()}]"
    assert said_about_the_code(capsys) == [f"{prefix} {CODE_TOPK_LINE}"]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, reason", [
    ("topk(0.1", "not an expression"),
    ("gzip", "unknown name 'gzip'"),
    ("__import__('os').system('touch /tmp/hvdx-pwned')", "neither a name nor a call"),
    ("topk(ratio=__import__('os').getpid())", "is not a Python literal"),
    ("topk(0.1, cross_every=4)", "unexpected keyword argument 'cross_every'"),
    ("topk(2.0)", "ratio=2.0"),
    ("topk(preset='fastest')", "preset='fastest' must be one of 'fast', 'safe'"),
    ("topk(0.1, selector='exact', topk_method='sampled_threshold')",
     "selector='exact' and topk_method='sampled_threshold' disagree"),
])
def test_a_value_that_is_not_accepted_fails_every_rank_naming_the_variable(value, reason):
    message = refused_everywhere(value, value)
    assert f"HVDX_COMPRESSION={value!r}" in message and reason in message
    assert not pathlib.Path("/tmp/hvdx-pwned").exists()


@pytest.mark.mpi(min_size=2)
def test_a_rank_launched_with_another_value_fails_every_rank():
    message = refused_everywhere("topk(0.2)" if hvd.rank() == 1 else "topk(0.1)",
                                 "another_value")
    assert "setting 'HVDX_COMPRESSION' differs between ranks" in message
    assert "'topk(0.1)'" in message and "rank 1 has 'topk(0.2)'" in message


@pytest.mark.mpi(min_size=2)
def test_a_rank_launched_without_the_variable_fails_every_rank():
    message = refused_everywhere("fast" if hvd.rank() == 1 else None, "unset")
    assert "HVDX_COMPRESSION" in message and "ranks disagree" in message


@pytest.mark.mpi(min_size=2)
def test_a_value_unparsable_on_one_rank_only_fails_every_rank():
    message = refused_everywhere("topk(0.1,," if hvd.rank() == 1 else "topk(0.1)",
                                 "unparsable")
    assert "rank 1" in message and "HVDX_COMPRESSION='topk(0.1,,'" in message


@pytest.mark.mpi(min_size=1)
def test_topk_passed_without_calling_it_fails_every_rank_saying_to_call_it():
    with pytest.raises(ValueError, match=r"call it: compression=hvd\.Compression\.topk\(") \
            as info:
        trained(steps=0, compression=hvd.Compression.topk)
    assert len(set(hvd.allgather_object(str(info.value)))) == 1


@pytest.mark.mpi(min_size=1)
def test_init_asks_every_rank_for_dynamic_process_sets_when_the_sync_is_dssync():
    with hvdx_variables(sync="DSSync()"):
        assert init_arguments((), {}) == ((), {"process_sets": "dynamic"})
    with hvdx_variables(compression="fast", sync="Decentralized()"):
        assert init_arguments((), {}) == ((), {})


@pytest.mark.mpi(min_size=2)
def test_init_fails_every_rank_when_a_rank_was_launched_with_another_value():
    with hvdx_variables(sync="DSSync()" if hvd.rank() == 1 else None):
        with pytest.raises(ValueError) as info:
            init_arguments((), {})
    message = str(info.value)
    assert message.startswith("hvdx init: HVDX_SYNC differs between ranks (rank 0: "
                              "unset, rank 1: 'DSSync()'")
    assert len(set(hvd.allgather_object(message))) == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compression, sync", [
    ("topk(ration=0.1)", None), (None, "DSSync(group_size=3)"), ("topk(0.1", None)])
def test_init_refuses_a_misspelt_value_on_every_rank_alike(compression, sync):
    """Before Horovod's init and the script's data: the error hvdx's hook ends the job
    with, printing its message once (tests/launch/test_environment_launch.py)."""
    with hvdx_variables(compression=compression, sync=sync):
        with pytest.raises(VariableError) as info:
            init_arguments((), {}, environment.check_at_init)  # as hvd.init calls it
    assert len(set(hvd.allgather_object(str(info.value)))) == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value", ["fast", "safe"])
def test_a_preset_from_the_environment_trains_adam_without_momentum_correction(
        value, capsys):
    """An unchanged Adam script under HVDX_COMPRESSION=fast|safe: the preset runs without
    DGC's momentum correction (SGD's only) and sends 20% both ways (Adam is adaptive),
    bitwise as the same choice made in code."""
    def adam(parameters):
        return torch.optim.Adam(parameters, lr=0.01)

    def with_adam(optimizer, **arguments):
        return hvd.DistributedOptimizer(adam(optimizer.param_groups[0]["params"]),
                                        **arguments)

    with hvdx_variables(compression=value):
        optimizer, from_environment = trained(with_adam)
    _, from_code = trained(with_adam, compression=hvd.Compression.topk(
        preset=value, momentum_correction=False))
    spec = optimizer._hvdx_sync.compression
    assert not spec.momentum_correction and spec.momentum_masking
    assert spec == hvd.Compression.topk(0.2, 0.2, topk_method="sampled_threshold",
                                        selection="global", small_tensors="in_topk_step")
    assert bitwise(from_environment, from_code)
    said = [line for line in capsys.readouterr().err.splitlines()
            if "runs without DGC's momentum correction" in line]
    assert len(said) <= (hvd.rank() == 0)  # once per process: an earlier test may have
