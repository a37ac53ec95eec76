"""`import hvdx.torch as hvd` is a drop-in for `import horovod.torch as hvd`."""

import copy
import types

import horovod.torch
import pytest
import torch
import torch.nn.functional as F

import hvdx.torch as hvd
from torch_models import SmallCNN, batches
from mpi4py import MPI

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                reason="drop-in identity with Horovod: checked at 1 and 2 ranks")


def test_every_public_horovod_torch_name_is_exported():
    # Submodules become attributes whenever anything imports them; hvd.elastic is API.
    public = {n for n in dir(horovod.torch) if not n.startswith("_")
              and not isinstance(getattr(horovod.torch, n), types.ModuleType)}
    assert not sorted(n for n in public if not hasattr(hvd, n))
    assert hvd.elastic is horovod.torch.elastic
    # Every other name is Horovod's own object: an hvdx module of the same name (say
    # hvdx/torch/broadcast.py) would shadow Horovod's function of that name.
    extended = {"Compression", "DistributedOptimizer", "broadcast_optimizer_state", "init",
                "join", "shutdown", "start_timeline", "stop_timeline"}
    assert sorted(n for n in public if getattr(hvd, n) is not getattr(horovod.torch, n)) \
        == sorted(extended)


def test_same_signature_as_horovod_plus_sync_and_named_buffers():
    import inspect
    ours = inspect.signature(hvd.DistributedOptimizer).parameters
    theirs = inspect.signature(horovod.torch.DistributedOptimizer).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    assert list(ours)[len(theirs):] == ["sync", "named_buffers"]
    for name, p in theirs.items():
        assert ours[name].default is p.default or ours[name].default == p.default, name


def train(make_optimizer, model, steps=20, **kwargs):
    optimizer = make_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters(), **kwargs)
    passes = kwargs.get("backward_passes_per_step", 1)
    data = batches(hvd.rank(), steps * passes)
    for step in range(steps):
        optimizer.zero_grad()
        for x, y in data[step * passes:(step + 1) * passes]:
            F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


HOROVOD_ARGUMENTS = [
    {},
    {"backward_passes_per_step": 2},
    {"op": hvd.Sum},
    {"compression": hvd.Compression.fp16},
    {"gradient_predivide_factor": 2.0},
    {"num_groups": 2},
    {"sparse_as_dense": True, "process_set": hvd.global_process_set},
]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kwargs", HOROVOD_ARGUMENTS, ids=lambda k: ",".join(k) or "defaults")
def test_twenty_steps_are_bitwise_identical_to_horovod(kwargs):
    torch.manual_seed(1)
    initial = SmallCNN()
    hvd.broadcast_parameters(initial.state_dict(), root_rank=0)
    ours = train(hvd.DistributedOptimizer, copy.deepcopy(initial), **kwargs)
    theirs = train(horovod.torch.DistributedOptimizer, copy.deepcopy(initial), **kwargs)
    for (name, a), b, start in zip(ours.named_parameters(), theirs.parameters(),
                                   initial.parameters()):
        assert torch.equal(a, b), f"{name} differs from Horovod's"
        assert not torch.equal(a, start), f"{name} did not train"
        # Averaged gradients keep the replicas identical.
        gathered = hvd.allgather(a.detach().unsqueeze(0), name=f"check.{name}")
        assert all(torch.equal(gathered[0], g) for g in gathered)


def test_with_no_hvdx_feature_the_optimizer_is_horovods_own():
    model = SmallCNN()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert type(opt).__module__ == "horovod.torch.optimizer"


def test_an_unknown_sync_strategy_is_rejected():
    model = SmallCNN()
    with pytest.raises(TypeError, match="sync='gossip'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync="gossip")


@pytest.mark.mpi(min_size=2)
def test_a_different_layer_on_one_rank_raises_the_same_error_on_every_rank():
    model = SmallCNN(hidden=32 if hvd.rank() != 1 else 48)
    with pytest.raises(ValueError) as info:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())
    message = str(info.value)
    assert "'fc1.weight'" in message and "float32[32, 128]" in message
    assert "float32[48, 128]" in message and "rank 1" in message
    # Same text everywhere: every rank saw the same gathered fingerprints.
    assert len(set(hvd.allgather_object(message))) == 1


@pytest.mark.mpi(min_size=2)
def test_a_parameter_missing_on_one_rank_is_named():
    model = SmallCNN()
    params = list(model.named_parameters())
    if hvd.rank() == hvd.size() - 1:
        params = params[:-1]
    with pytest.raises(ValueError, match="'fc2.bias'.*exists on rank 0 but not on rank"):
        hvd.DistributedOptimizer(torch.optim.SGD([p for _, p in params], lr=0.1),
                                 named_parameters=params)


@pytest.mark.mpi(min_size=2)
def test_a_different_setting_on_one_rank_is_named():
    model = SmallCNN()
    with pytest.raises(ValueError, match="setting 'backward_passes_per_step'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 backward_passes_per_step=1 + (hvd.rank() == 1))


@pytest.mark.mpi(min_size=2)
def test_after_a_rejected_optimizer_the_job_still_works():
    model = SmallCNN(hidden=32 + hvd.rank())
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after_rejection")
    assert torch.equal(total, torch.full((3,), float(hvd.size())))


@pytest.mark.parametrize("name", ["broadcast_optimizer_state", "join"])
def test_the_functions_hvdx_extends_take_horovods_arguments(name):
    import inspect
    ours, theirs = getattr(hvd, name), getattr(horovod.torch, name)
    assert ours is not theirs
    assert list(inspect.signature(ours).parameters) == \
        list(inspect.signature(theirs).parameters)
