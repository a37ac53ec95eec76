"""DS-Sync and decentralized SGD chosen by ``HVDX_SYNC`` for an unchanged Horovod script
(torch).

The variable is set on every rank inside the test (``hvdx_variables``) before the
optimizer is built, as ``mpirun -genv`` would set it; the reference is the same
strategy passed in code.
"""

import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F

import hvdx
import hvdx.torch as hvd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "torch"))
from hvdx_variables import hvdx_variables  # noqa: E402
from torch_models import SmallCNN, batches  # noqa: E402
from mpi4py import MPI  # noqa: E402

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the environment switch: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]


def trained(steps=3, **arguments):
    """The optimizer and the parameters after ``steps`` steps of SmallCNN (momentum SGD,
    different data per rank), every exchange completed."""
    torch.manual_seed(1)
    model = SmallCNN()
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), **arguments)
    for x, y in batches(hvd.rank(), steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    optimizer.synchronize()
    return optimizer, [p.detach().clone() for p in model.parameters()]


def refused_everywhere(sync, name, **arguments):
    """The ``ValueError`` with which building the optimizer fails, after checking that
    every rank raised the same message and that no rank was left in a collective."""
    with pytest.raises(ValueError) as info:
        with hvdx_variables(sync=sync):
            trained(steps=0, **arguments)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{name}")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))
    return message


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, in_code", [
    ("DSSync()", lambda: hvdx.DSSync()),
    ("Decentralized(graph='one-peer-exp')", lambda: hvdx.Decentralized("one-peer-exp")),
])
def test_a_sync_from_the_environment_trains_bitwise_like_the_same_sync_in_code(
        value, in_code):
    with hvdx_variables(sync=value):
        optimizer, from_environment = trained()
    _, from_code = trained(sync=in_code())
    assert repr(optimizer._hvdx_sync) == repr(in_code())
    assert all(torch.equal(a, b) for a, b in zip(from_environment, from_code))


@pytest.mark.mpi(min_size=1)
def test_a_sync_in_the_code_wins_over_the_environment(capsys):
    with hvdx_variables(sync="DSSync()"):
        optimizer, _ = trained(steps=0, sync=hvdx.Decentralized("static-exp"))
    assert repr(optimizer._hvdx_sync) == repr(hvdx.Decentralized("static-exp"))
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx] HVDX_SYNC=")]
    assert len(said) == (hvd.rank() == 0)
    assert all("'DSSync()': ignored: the code passes sync=decentralized SGD, "
               "Decentralized(graph='static-exp'" in line for line in said)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("value, reason", [
    ("DSSync(cross_every=4)", "unexpected keyword argument 'cross_every'"),
    ("Gossip()", "unknown name 'Gossip'"),
    ("hvdx.DSSync()", "neither a name nor a call"),
    ("Decentralized(mix_every=0)", "mix_every=0"),
])
def test_a_value_that_is_not_accepted_fails_every_rank_naming_the_variable(value, reason):
    message = refused_everywhere(value, value)
    assert f"HVDX_SYNC={value!r}" in message and reason in message


@pytest.mark.mpi(min_size=2)
def test_a_rank_launched_with_another_strategy_fails_every_rank():
    message = refused_everywhere(
        "Decentralized(graph='ring')" if hvd.rank() == 1 else "DSSync()", "another")
    assert "setting 'HVDX_SYNC' differs between ranks" in message
    assert "rank 1 has \"Decentralized(graph='ring')\"" in message


@pytest.mark.mpi(min_size=1)
def test_a_sync_from_the_environment_refuses_a_compression_in_the_code_as_in_code():
    message = refused_everywhere("DSSync()", "compression",
                                 compression=hvd.Compression.topk(0.1))
    assert "DS-Sync sends no gradients to compress" in message
