"""A wrong value on one rank only fails on every rank, with the same message, no hang.

Every public constructor is covered: the strategy specs (``Compression.topk``,
``hvdx.DSSync``, ``hvdx.Decentralized``), ``DistributedOptimizer`` itself and
``dssync_process_sets``. Rank 1 gets the wrong value, the others a valid one. In a job
of several ranks a spec's constructor keeps its ``ValueError``
(:func:`hvdx.strategy_contract.validating`) and the optimizer raises it on every rank after the
cross-rank check; a plain Horovod allreduce afterwards shows that no rank was left
inside a collective.
"""

import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd
from hvdx.strategies.dssync.mixer import dssync_process_sets
from mpi4py import MPI

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="a wrong value on one rank: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

#: name -> (the valid arguments, the wrong ones on rank 1, text the message must hold).
#: The valid DS-Sync rotation detects the topology while it is prepared (collective):
#: a rank that skipped it would leave the others waiting there.
SPECS = {
    "topk ratio": (lambda: hvd.Compression.topk(0.1), lambda: hvd.Compression.topk(2.0),
                   "ratio=2.0"),
    "topk mode": (lambda: hvd.Compression.topk(0.1),
                  lambda: hvd.Compression.topk(0.1, mode="scattered"), "mode='scattered'"),
    "dssync schedule": (lambda: hvdx.DSSync(), lambda: hvdx.DSSync("shuffled"),
                        "schedule='shuffled'"),
    "dssync intra_phases": (lambda: hvdx.DSSync(), lambda: hvdx.DSSync(intra_phases=0),
                            "intra_phases=0"),
    "dssync group_size": (lambda: hvdx.DSSync("shuffle", group_size=2),
                          lambda: hvdx.DSSync("shuffle", group_size=-1), "group_size=-1"),
    "decentralized graph": (lambda: hvdx.Decentralized("ring"),
                            lambda: hvdx.Decentralized("star"), "graph='star'"),
    "decentralized mix_every": (lambda: hvdx.Decentralized(),
                                lambda: hvdx.Decentralized(mix_every=0), "mix_every=0"),
    "decentralized matrix": (lambda: hvdx.Decentralized(),
                             lambda: hvdx.Decentralized([[0.5, 0.5], [0.5, 0.6]]),
                             "graph"),
}


def optimizer_with(spec):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
    argument = "compression" if isinstance(spec, hvdx.strategies.topk.spec.TopKCompression) \
        else "sync"
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(),
                                    **{argument: spec})


def the_same_everywhere(message):
    return len(set(hvd.allgather_object(message))) == 1


def nobody_waits(name):
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=f"after.{name}")
    return torch.equal(total, torch.full((2,), float(hvd.size())))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_wrong_on_one_rank_fails_the_optimizer_on_every_rank(name):
    valid, wrong, text = SPECS[name]
    spec = wrong() if hvd.rank() == 1 else valid()  # no error yet: kept for the check
    with pytest.raises(ValueError) as info:
        optimizer_with(spec)
    message = str(info.value)
    assert "rank 1" in message and text in message
    assert the_same_everywhere(message)
    assert nobody_waits(name)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_wrong_on_every_rank_raises_its_own_message_at_the_optimizer(name):
    _, wrong, text = SPECS[name]
    spec = wrong()
    assert isinstance(spec.error, ValueError)
    with pytest.raises(ValueError, match=text.replace("[", r"\[").replace("(", r"\(")) \
            as info:
        optimizer_with(spec)
    assert info.value is spec.error  # the constructor's own error, not a disagreement
    assert nobody_waits(f"all.{name}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_alone_the_constructor_raises_at_once(name):
    if hvd.size() > 1:
        pytest.skip("a job of one rank")
    _, wrong, text = SPECS[name]
    with pytest.raises(ValueError, match="graph" if name.endswith("matrix") else text):
        wrong()


@pytest.mark.mpi(min_size=2)
def test_a_sync_of_the_wrong_type_on_one_rank_fails_every_rank():
    sync = "dssync" if hvd.rank() == 1 else hvdx.DSSync("shuffle", group_size=2)
    with pytest.raises((TypeError, ValueError)) as info:
        optimizer_with(sync)
    message = str(info.value)
    assert "rank 1" in message and "sync='dssync'" in message
    assert the_same_everywhere(message)
    assert nobody_waits("sync.type")


@pytest.mark.mpi(min_size=2)
def test_a_horovod_argument_on_one_rank_fails_every_rank():
    model = nn.Linear(4, 1)
    with pytest.raises(ValueError) as info:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 op=hvd.Sum if hvd.rank() == 1 else hvd.Average)
    assert "op" in str(info.value) and the_same_everywhere(str(info.value))
    assert nobody_waits("op")


@pytest.mark.mpi(min_size=2)
def test_dssync_process_sets_with_a_wrong_spec_on_one_rank_fails_every_rank():
    sync = hvdx.DSSync("shuffled") if hvd.rank() == 1 else hvdx.DSSync()
    with pytest.raises(ValueError) as info:
        dssync_process_sets(sync, hvd.size())
    message = str(info.value)
    assert "rank 1" in message and "schedule='shuffled'" in message
    assert the_same_everywhere(message)
    assert nobody_waits("process_sets")
