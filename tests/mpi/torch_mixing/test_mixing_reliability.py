"""Parameter mixing (DS-Sync, decentralized SGD) where one rank's step differs: mixed
precision skipping a step after an overflow, and optimizer state that exists on some
ranks only. Either would leave a group or a neighbour waiting forever."""

import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd

pytestmark = [pytest.mark.dssync, pytest.mark.decentralized]


def syncs():
    return {"decentralized": hvdx.Decentralized("complete", average_optimizer_state=True),
            "dssync": hvdx.DSSync("shuffle", group_size=hvd.size(), seed=1,
                                  average_optimizer_state=True)}


def model_and_optimizer(sync, lr=0.1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), sync=sync)
    return model, opt


def batch(step):
    g = torch.Generator().manual_seed(100 * step + hvd.rank())
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def everyone(t, name):
    return hvd.allgather(t.detach().reshape(1, -1), name=name)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["decentralized", "dssync"])
def test_an_overflow_on_one_rank_makes_every_rank_skip_the_step_under_grad_scaler(strategy):
    model, opt = model_and_optimizer(syncs()[strategy])
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        x, y = batch(step)
        opt.zero_grad()
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        if step == 1 and hvd.rank() == 1:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        opt.synchronize()  # Horovod's AMP recipe
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        skipped = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert skipped == (step == 1)  # on every rank, the overflowing step only
    assert scaler.get_scale() == 512.0
    assert opt._hvdx_mixer.step == 2
    first = next(model.parameters())
    gathered = everyone(first, f"amp.{strategy}")
    # Mixed over all ranks (complete graph / one group): the same up to rounding order.
    assert all(torch.allclose(gathered[0], g, rtol=0, atol=1e-6) for g in gathered)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["decentralized", "dssync"])
def test_state_missing_on_one_rank_is_left_out_until_every_rank_has_it(strategy):
    model, opt = model_and_optimizer(syncs()[strategy])
    last = model[2].weight
    for step in range(2):
        x, y = batch(step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if step == 0 and hvd.rank() == 1:
            last.grad = None  # no gradient here: SGD creates no momentum for it
        opt.step()  # must not wait forever on mismatched tensor lists
    momentum = opt.state[last]["momentum_buffer"]
    gathered = everyone(momentum, f"state.{strategy}")
    # Mixed over all ranks (complete graph / one group) at step 1, when all had it.
    assert all(torch.allclose(gathered[0], g, rtol=0, atol=1e-7) for g in gathered)
