"""Exact resume with hvdx.torch.save_checkpoint / load_checkpoint, for every strategy:
stopping at step k, writing one checkpoint, and resuming in fresh objects gives the
parameters of an uninterrupted run at step N bit for bit (CPU, fixed seeds). Every rank
keeps its own state (residuals, local parameters and momenta, step counters) although
rank 0 alone writes and reads the file."""

import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

STEPS, STOP = 6, 3


def strategies():
    return {
        "horovod": {},
        "topk": {"compression": hvd.Compression.topk(0.1, 0.05, min_size=0)},
        "dssync": {"sync": hvdx.DSSync("shuffle", group_size=min(2, hvd.size()), seed=4,
                                       swa_start=1)},
        "decentralized": {"sync": hvdx.Decentralized("one-peer-exp", global_every=4)},
        "decentralized-cta": {"sync": hvdx.Decentralized("ring",
                                                         order="combine_then_adapt")},
    }


def build(strategy):
    torch.manual_seed(hvd.rank())  # different weights per rank: the mixing strategies
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), **strategies()[strategy],
        **({"named_buffers": model.named_buffers()} if "sync" in strategies()[strategy]
           else {}))
    return model, opt


def train(model, opt, steps):
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + hvd.rank())
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    if hasattr(opt, "hvdx_graph"):
        opt.synchronize()  # complete decentralized SGD's exchange in flight


def shared_path(tmp_path):
    return hvd.broadcast_object(str(tmp_path / "ckpt.pt"), root_rank=0, name="ckpt.path")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", ["decentralized", "decentralized-cta", "dssync",
                                      "horovod", "topk"])
def test_resuming_from_a_checkpoint_is_bitwise_an_uninterrupted_run(strategy, tmp_path):
    path = shared_path(tmp_path)
    straight, opt = build(strategy)
    train(straight, opt, range(STEPS))

    first, opt = build(strategy)
    train(first, opt, range(STOP))
    hvd.save_checkpoint(path, first, opt, step=STOP)
    resumed, opt = build(strategy)  # fresh objects, other weights
    assert hvd.load_checkpoint(path, resumed, opt) == {"step": STOP}
    train(resumed, opt, range(STOP, STEPS))
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{strategy}: {name} differs after resuming"


@pytest.mark.mpi(min_size=2)
def test_each_rank_gets_its_own_state_back():
    path = shared_path_of_rank0()
    model, opt = build("decentralized")
    train(model, opt, range(2))
    mine = [p.detach().clone() for p in model.parameters()]
    hvd.save_checkpoint(path, model, opt)
    other, opt2 = build("decentralized")
    hvd.load_checkpoint(path, other, opt2)
    for a, b in zip(mine, other.parameters()):
        assert torch.equal(a, b)  # this rank's, not rank 0's


def shared_path_of_rank0():
    import tempfile
    directory = tempfile.mkdtemp(prefix="hvdx-ckpt-") if hvd.rank() == 0 else None
    return hvd.broadcast_object(f"{directory}/ckpt.pt" if directory else None,
                                root_rank=0, name="ckpt.rank0")


@pytest.mark.mpi(min_size=1)
def test_a_missing_or_foreign_file_fails_on_every_rank_and_loads_nothing(tmp_path):
    path = shared_path(tmp_path)
    model, opt = build("topk")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="cannot read"):
        hvd.load_checkpoint(path + ".missing", model, opt)
    if hvd.rank() == 0:
        torch.save({"model": {}}, path)
    with pytest.raises(ValueError, match="not a checkpoint written by hvdx"):
        hvd.load_checkpoint(path, model, opt)
    if hvd.rank() == 0:
        torch.save({"format": "hvdx-checkpoint-1", "size": hvd.size() + 1, "ranks": []},
                   path)
    with pytest.raises(ValueError, match=f"holds {hvd.size() + 1} ranks' state and this "
                                         f"job has {hvd.size()} ranks"):
        hvd.load_checkpoint(path, model, opt)
    if hvd.rank() == 0:  # a pickle of a name that does not exist: AttributeError on load
        with open(path, "wb") as f:
            f.write(b"chvdx\nno_such_name\n.")
    with pytest.raises(ValueError, match="cannot read"):
        hvd.load_checkpoint(path, model, opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
