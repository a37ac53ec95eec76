"""DS-Sync for torch: local steps, then group averaging over Horovod process sets.

Checked against the numpy reference (hvdx.core.group_averaging), against Horovod's
parameter averaging and synchronous SGD, and for the identities of the algorithm
(consensus after one rotation period, mean preserved, group size 1 = local SGD).
"""

import copy
import pathlib
import sys

import horovod.torch
import numpy as np
import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd
from hvdx.core.group_averaging import simulate_dssync
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.core_schedule import ShuffleSchedule
from hvdx.strategies.dssync.mixer import dssync_process_sets
from hvdx.strategies.dssync.spec import DSSync

STATE_KEY = DSSync.state_key

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from spec_errors import refused  # noqa: E402

pytestmark = [pytest.mark.dssync]


def model_for(seed, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Linear(5, 3).to(dtype)


def data(rank, step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 5, generator=g).to(dtype), torch.randn(8, 3, generator=g).to(dtype)


def backward(model, rank, step):
    x, y = data(rank, step, next(model.parameters()).dtype)
    ((model(x) - y) ** 2).mean().backward()


def dssync_optimizer(model, sync, lr=0.1, **sgd):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, **sgd),
                                    named_parameters=model.named_parameters(), sync=sync)


def train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        backward(model, hvd.rank(), step)
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(vector, name):
    return hvd.allgather(vector.unsqueeze(0), name=name)


# --- against Horovod ------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_one_group_of_all_ranks_is_horovod_parameter_averaging():
    n, rank = hvd.size(), hvd.rank()
    ours = model_for(rank)
    reference = copy.deepcopy(ours)
    opt = dssync_optimizer(ours, hvdx.DSSync("shuffle", group_size=n), momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        opt.zero_grad()
        backward(ours, rank, step)
        opt.step()
        ref_opt.zero_grad()
        backward(reference, rank, step)
        ref_opt.step()
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                p.copy_(horovod.torch.allreduce(p, op=horovod.torch.Average,
                                                name=f"ref.avg.{i}"))
        assert torch.allclose(flat(ours), flat(reference), atol=1e-6, rtol=0)
    assert opt.hvdx_stats.steps == 4
    model_bytes = sum(p.numel() * 4 for p in ours.parameters())
    assert opt.hvdx_stats.last_bytes == pytest.approx(2 * (n - 1) / n * model_bytes)
    assert opt.hvdx_stats.total_bytes == pytest.approx(4 * opt.hvdx_stats.last_bytes)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_one_group_from_identical_weights_is_horovod_synchronous_sgd(momentum):
    n = hvd.size()
    initial = model_for(0)
    ours, theirs = copy.deepcopy(initial), copy.deepcopy(initial)
    # Averaging the momentum buffers too keeps SGD with momentum linear in the gradients.
    opt = dssync_optimizer(ours, hvdx.DSSync("shuffle", group_size=n,
                                             average_optimizer_state=True),
                           momentum=momentum)
    ref_opt = horovod.torch.DistributedOptimizer(
        torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=momentum),
        named_parameters=theirs.named_parameters())
    train(ours, opt, 5)
    train(theirs, ref_opt, 5)
    assert torch.allclose(flat(ours), flat(theirs), atol=1e-6, rtol=0)
    assert not torch.equal(flat(ours), flat(initial))


# --- against the numpy reference ------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["shuffle", "rotation-detected", "rotation-racks-of-2"])
def test_matches_the_numpy_reference(kind):
    n, rank = hvd.size(), hvd.rank()
    if kind == "shuffle" and n < 2:
        pytest.skip("group_size=2 needs two ranks")
    sync = {
        "shuffle": lambda: hvdx.DSSync("shuffle", group_size=2, seed=7),
        "rotation-detected": lambda: hvdx.DSSync("rotation"),
        "rotation-racks-of-2": lambda: hvdx.DSSync("rotation", topology=Topology.from_ranks(
            hosts=range(n), racks=[r // 2 for r in range(n)])),
    }[kind]()
    centres = np.stack([np.random.default_rng(r).normal(size=4) for r in range(n)])
    initial = np.stack([np.random.default_rng(100 + r).normal(size=4) for r in range(n)])
    x = nn.Parameter(torch.tensor(initial[rank]))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([x], lr=0.3), sync=sync)
    for step in range(5):
        opt.zero_grad()
        (0.5 * ((x - torch.tensor(centres[rank])) ** 2).sum()).backward()
        opt.step()
    expected = simulate_dssync(initial, lambda v, t: v - centres, 0.3,
                               opt._hvdx_schedule, 5)
    np.testing.assert_allclose(x.detach().numpy(), expected[rank], rtol=0, atol=1e-12)


def explicit_partitions(n):
    """Partitions written out by hand, cycled through step by step."""
    if n == 4:
        return [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 3], [1], [2]], [[0, 1, 2, 3]]]
    if n == 2:
        return [[[0, 1]], [[0], [1]]]
    return [[list(range(n))]]


@pytest.mark.mpi(min_size=1)
def test_matches_explicit_partitions_averaged_in_numpy():
    # Independent of the schedule objects: the groups are the lists above, and each
    # step is "local SGD step, then every group's mean", written as loops here.
    n, rank = hvd.size(), hvd.rank()
    if n not in (1, 2, 4):
        pytest.skip("partitions are written out for 1, 2 and 4 ranks")
    partitions = explicit_partitions(n)
    centres = np.stack([np.random.default_rng(r).normal(size=4) for r in range(n)])
    x_all = np.stack([np.random.default_rng(100 + r).normal(size=4) for r in range(n)])
    x = nn.Parameter(torch.tensor(x_all[rank]))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([x], lr=0.3),
                                   sync=hvdx.DSSync(schedule=partitions))
    for step in range(6):
        opt.zero_grad()
        (0.5 * ((x - torch.tensor(centres[rank])) ** 2).sum()).backward()
        opt.step()
        local = x_all - 0.3 * (x_all - centres)
        for group in partitions[step % len(partitions)]:
            local[group] = local[group].mean(axis=0)
        x_all = local
    np.testing.assert_allclose(x.detach().numpy(), x_all[rank], rtol=0, atol=1e-12)


# --- identities -----------------------------------------------------------------------

@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("cross_ranks", [None, 2])
def test_lr0_rotation_reaches_the_global_mean_after_one_period(cross_ranks):
    if hvd.size() != 4:
        pytest.skip("the 2 racks x 2 hosts topology has four ranks")
    rank = hvd.rank()
    model = model_for(rank, torch.float64)
    start = gathered(flat(model), "rotation.start")
    mean = start.mean(dim=0)
    sync = hvdx.DSSync("rotation", topology=Topology.from_counts(2, 2, 1),
                       cross_ranks=cross_ranks)
    opt = dssync_optimizer(model, sync, lr=0.0)
    period = opt._hvdx_schedule.period
    assert period == 2
    for step in range(period):
        train(model, opt, 1, start=step)
        if step < period - 1:
            assert not torch.allclose(flat(model), mean, atol=1e-6, rtol=0)
    assert torch.allclose(flat(model), mean, atol=1e-12, rtol=0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("sync", [
    hvdx.DSSync("shuffle", group_size=2, seed=3),
    hvdx.DSSync("rotation"),
    hvdx.DSSync("rotation", global_every=2),
], ids=["shuffle", "rotation", "global-every-2"])
def test_lr0_preserves_the_global_mean(sync):
    n, rank = hvd.size(), hvd.rank()
    if sync.kind == "shuffle" and n < 2:
        pytest.skip("group_size=2 needs two ranks")
    model = model_for(rank, torch.float64)
    mean = gathered(flat(model), "mean.start").mean(dim=0)
    opt = dssync_optimizer(model, sync, lr=0.0)
    for step in range(6):
        train(model, opt, 1, start=step)
        now = gathered(flat(model), f"mean.{step}").mean(dim=0)
        assert torch.allclose(now, mean, atol=1e-12, rtol=0)


@pytest.mark.mpi(min_size=1)
def test_group_size_1_is_local_sgd():
    rank = hvd.rank()
    ours = model_for(rank)
    local = copy.deepcopy(ours)
    opt = dssync_optimizer(ours, hvdx.DSSync("shuffle", group_size=1), momentum=0.9)
    train(ours, opt, 5)
    train(local, torch.optim.SGD(local.parameters(), lr=0.1, momentum=0.9), 5)
    assert torch.equal(flat(ours), flat(local))
    assert opt.hvdx_stats.total_bytes == 0
    everyone = gathered(flat(ours), "local.sgd")
    if hvd.size() > 1:
        assert not torch.allclose(everyone[0], everyone[1])


@pytest.mark.mpi(min_size=1)
def test_synchronize_parameters_is_a_global_average():
    model = model_for(hvd.rank(), torch.float64)
    mean = gathered(flat(model), "sync.start").mean(dim=0)
    opt = dssync_optimizer(model, hvdx.DSSync("shuffle", group_size=1))
    opt.synchronize_parameters()
    assert torch.allclose(flat(model), mean, atol=1e-12, rtol=0)


# --- bad input: the same error on every rank ------------------------------------------

def test_group_size_0_is_rejected_naming_it():
    refused(lambda: hvdx.DSSync("shuffle", group_size=0), "group_size=0")


@pytest.mark.mpi(min_size=1)
def test_group_size_above_the_number_of_ranks_is_rejected_on_every_rank():
    model = model_for(0)
    with pytest.raises(ValueError, match=f"group_size={hvd.size() + 1}"):
        dssync_optimizer(model, hvdx.DSSync("shuffle", group_size=hvd.size() + 1))
    total = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.group_size")
    assert torch.equal(total, torch.full((2,), float(hvd.size())))


@pytest.mark.mpi(min_size=2)
def test_group_size_too_large_on_one_rank_stops_every_rank():
    n = hvd.size()
    sync = hvdx.DSSync("shuffle", group_size=n + 1 if hvd.rank() == 1 else n)
    with pytest.raises(ValueError, match="dssync"):
        dssync_optimizer(model_for(0), sync)


def test_overlapping_partitions_are_rejected():
    refused(lambda: hvdx.DSSync([[(0, 1), (1, 2)]]), "overlapping rank 1")


@pytest.mark.mpi(min_size=2)
def test_different_seeds_raise_the_fingerprint_error_on_every_rank():
    with pytest.raises(ValueError, match="setting 'dssync.seed'") as info:
        dssync_optimizer(model_for(0), hvdx.DSSync("shuffle", group_size=2,
                                                   seed=hvd.rank()))
    assert len(set(hvd.allgather_object(str(info.value)))) == 1


@pytest.mark.mpi(min_size=3)
def test_without_dynamic_process_sets_the_error_says_what_to_do(monkeypatch):
    n = hvd.size()
    # A group no other test registers: ranks 0, 1 and the last.
    partition = [[0, 1, n - 1]] + [[r] for r in range(2, n - 1)]
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "0")
    with pytest.raises(ValueError, match='process_sets="dynamic"') as info:
        dssync_optimizer(model_for(0), hvdx.DSSync([partition]))
    assert "dssync_process_sets(sync, size)" in str(info.value)


def test_compression_is_rejected():
    with pytest.raises(ValueError, match="compression"):
        hvd.DistributedOptimizer(torch.optim.SGD(model_for(0).parameters(), lr=0.1),
                                 compression=hvd.Compression.fp16,
                                 sync=hvdx.DSSync("shuffle", group_size=1))


# --- state ----------------------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_state_dict_round_trip_continues_the_same_schedule():
    n, rank = hvd.size(), hvd.rank()
    sync = hvdx.DSSync("shuffle", group_size=min(2, n), seed=5)
    model = model_for(rank)
    opt = dssync_optimizer(model, sync, momentum=0.9)
    train(model, opt, 3)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert saved_opt[STATE_KEY] == {"step": 3}
    train(model, opt, 3, start=3)

    resumed = model_for(rank + 100)
    resumed.load_state_dict(saved_model)
    opt2 = dssync_optimizer(resumed, sync, momentum=0.9)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, 3, start=3)
    assert opt2.state_dict()[STATE_KEY] == {"step": 6}
    assert torch.equal(flat(resumed), flat(model))


def test_the_optimizer_is_an_instance_of_the_users_class():
    opt = dssync_optimizer(model_for(0), hvdx.DSSync("shuffle", group_size=1))
    assert isinstance(opt, torch.optim.SGD)


# --- static registration --------------------------------------------------------------

def test_static_process_sets_of_a_rotation():
    sync = hvdx.DSSync("rotation", topology=Topology.from_counts(2, 2, 1))
    sets = dssync_process_sets(sync, 4)
    assert [ps.ranks for ps in sets] == [[0, 1], [0, 2], [1, 3], [2, 3]]
    with pytest.raises(ValueError, match="dynamic"):
        dssync_process_sets(hvdx.DSSync("shuffle", group_size=2), 4)


# --- the final SWA-style merge --------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_swa_merge_matches_the_numpy_reference_and_survives_state_dict():
    n, rank = hvd.size(), hvd.rank()
    sync = hvdx.DSSync("shuffle", group_size=min(2, n), seed=4, swa_start=1, swa_every=2)
    centres = np.stack([np.random.default_rng(r).normal(size=4) for r in range(n)])
    initial = np.stack([np.random.default_rng(100 + r).normal(size=4) for r in range(n)])
    x = nn.Parameter(torch.tensor(initial[rank]))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([x], lr=0.3), sync=sync)
    for step in range(6):
        opt.zero_grad()
        (0.5 * ((x - torch.tensor(centres[rank])) ** 2).sum()).backward()
        opt.step()
    expected, swa = simulate_dssync(initial, lambda v, t: v - centres, 0.3,
                                    opt._hvdx_schedule, 6, swa_start=1, swa_every=2)
    np.testing.assert_allclose(x.detach().numpy(), expected[rank], rtol=0, atol=1e-12)
    saved = opt.state_dict()[STATE_KEY]
    assert saved["step"] == 6 and saved["swa_count"] == 3
    np.testing.assert_allclose(saved["swa"][0].numpy(), swa[rank], rtol=0, atol=1e-12)

    y = nn.Parameter(torch.tensor(initial[rank]))
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD([y], lr=0.3), sync=sync)
    opt2.load_state_dict(opt.state_dict())
    with torch.no_grad():
        y.copy_(x)
    opt2.synchronize_parameters(swa=True)
    opt.synchronize_parameters(swa=True)
    np.testing.assert_allclose(x.detach().numpy(), swa.mean(axis=0), rtol=0, atol=1e-12)
    assert torch.equal(x, y)


def test_swa_merge_before_any_sample_is_rejected():
    opt = dssync_optimizer(model_for(0), hvdx.DSSync("shuffle", group_size=1, swa_start=3))
    with pytest.raises(ValueError, match="swa=True"):
        opt.synchronize_parameters(swa=True)
