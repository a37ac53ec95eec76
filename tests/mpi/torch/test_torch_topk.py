"""hvdx.torch.Compression.topk: bidirectional TopK with error feedback in PyTorch equals
the numpy reference, keeps every rank's update identical, reduces to Horovod's dense
averaging at ratio 1, checkpoints bitwise, and fails on every rank together."""

import copy
import gc
import math
import pathlib
import sys

import horovod.torch
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdx.torch as hvd
from hvdx.strategies.topk.core_bidirectional import TopKConfig, simulate_step
from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from torch_models import SmallCNN, batches

D = 3000
MODES = ("gathered", "sharded")
RATIOS = {"bidirectional": (0.02, 0.01), "unidirectional": (0.02, None)}

# Past two ranks only the references at other ranks' offsets and what counts ranks change;
# the rest runs at 1 and 2 ranks (tests/conftest.py).
pytestmark = [pytest.mark.up_to_two_ranks("TopK's settings, state, refusals and training"),
              pytest.mark.topk]


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import synthetic_gradients  # noqa: E402
from fake_comms import NoCollectives  # noqa: E402
from spec_errors import refused  # noqa: E402


class Flat(nn.Module):
    def __init__(self, d=D, dtype=torch.float32):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d, dtype=dtype))


def grads_of_all_ranks(step, d=D, seed=0):
    """Every rank's gradient at ``step`` (:mod:`synthetic_gradients`, shared with the
    other framework's TopK tests)."""
    return synthetic_gradients.grads_of_all_ranks(hvd.size(), step, d, seed)


def topk_optimizer(model, compression, optimizer=None, **kwargs):
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    compression=compression, **kwargs)


def gather_all(t):
    return hvd.allgather(t.detach().reshape(1, -1).float(), name="check.gather")


def same_everywhere(t):
    gathered = gather_all(t)
    return all(torch.equal(gathered[0], g) for g in gathered)


def residual(opt, side, name="w"):
    return (opt._hvdx_worker if side == "worker" else opt._hvdx_server).get(name)


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("mode, direction, topk_method", [
    (mode, direction, "exact") for mode in MODES for direction in RATIOS
] + [(mode, "bidirectional", "sampled_threshold") for mode in MODES])
def test_update_equals_the_numpy_reference_bitwise(mode, direction, topk_method):
    ratio, downlink_ratio = RATIOS[direction]
    model = Flat()
    spec = hvd.Compression.topk(ratio, downlink_ratio, mode=mode, min_size=0,
                                topk_method=topk_method, sample_size=256, seed=3)
    opt = topk_optimizer(model, spec)
    size, rank = hvd.size(), hvd.rank()
    config = TopKConfig(ratio, downlink_ratio, topk_method=topk_method, sample_size=256,
                        seed=3)
    workers = [ResidualMemory(["w"]) for _ in range(size)]
    servers = [ResidualMemory(["w"]) for _ in range(size)]
    for step in range(3):
        grads = grads_of_all_ranks(step)
        model.w.grad = torch.from_numpy(grads[rank].copy())
        agreed = opt.hvdx_stats.phases["agree"][1]
        opt.step()
        agreed = opt.hvdx_stats.phases["agree"][1] - agreed  # sharded: the global TopK's
        ref = simulate_step(grads, workers, servers, config, mode, step=step, name="w")
        u = model.w.grad.numpy()
        assert u.dtype == np.float32
        assert np.array_equal(u, ref.u), f"step {step}: differs from the reference"
        assert same_everywhere(model.w.grad)
        assert np.array_equal(residual(opt, "worker"), workers[rank].get("w"))
        # Bytes: the pairs handed to MPI (8 bytes each) plus one 8-byte count per peer
        # and collective (gathered: one allgatherv; sharded: alltoallv + allgatherv).
        collectives = 1 if mode == "gathered" else 2
        stats = opt.hvdx_stats
        assert stats.last_received - agreed == \
            ref.stats.recv_bytes[rank] + collectives * 8 * (size - 1)
        assert (agreed > 0) == (mode == "sharded" and downlink_ratio is not None and size > 1)
        if mode == "gathered":
            assert stats.last_sent == (size - 1) * 8 * (ref.stats.nnz_up[rank] + 1)
        if downlink_ratio is not None:
            assert np.count_nonzero(u) <= config.k_down(D)
            assert np.array_equal(residual(opt, "server"), servers[rank].get("w"))
    assert opt.hvdx_stats.total_sent > 0 or size == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
def test_ratio_one_is_horovods_dense_average_and_residuals_stay_zero(mode):
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(1.0, 1.0, mode=mode, min_size=0))
    for step in range(2):
        g = torch.from_numpy(grads_of_all_ranks(step)[hvd.rank()].copy())
        dense = horovod.torch.allreduce(g, op=hvd.Average, name="check.dense")
        model.w.grad = g.clone()
        opt.step()
        assert torch.allclose(model.w.grad, dense, atol=1e-6, rtol=0)
        assert not np.any(residual(opt, "worker")) and not np.any(residual(opt, "server"))


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", RATIOS)
def test_residual_bookkeeping_over_several_steps(mode, direction):
    # P * (sum_t u_t + e_s) + sum_i e_i == sum_i sum_t g_i,t  (m_t is the mean of s_i,t).
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(*RATIOS[direction], mode=mode,
                                                     min_size=0))
    size, steps = hvd.size(), 5
    sum_u = np.zeros(D)
    for step in range(steps):
        model.w.grad = torch.from_numpy(grads_of_all_ranks(step, seed=1)[hvd.rank()].copy())
        opt.step()
        sum_u += model.w.grad.numpy()
    sum_g = sum(g.astype(np.float64) for step in range(steps)
                for g in grads_of_all_ranks(step, seed=1))
    workers = gather_all(torch.from_numpy(residual(opt, "worker"))).double().sum(0).numpy()
    server = np.zeros(D)
    if direction == "bidirectional":
        e_s = torch.from_numpy(residual(opt, "server"))
        if mode == "gathered":
            assert same_everywhere(e_s)  # replicated
            server = e_s.double().numpy()
        else:  # each rank holds its shard, in rank order
            server = horovod.torch.allgather(e_s, name="check.shards").double().numpy()
    np.testing.assert_allclose(size * (sum_u + server) + workers, sum_g, rtol=1e-5, atol=1e-4)


def train(model, opt, data, losses=None):
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if losses is not None:
            losses.append(loss.item())


def initial_model():
    torch.manual_seed(1)
    model = SmallCNN()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


@pytest.mark.mpi(min_size=1)
def test_state_dict_round_trip_continues_bitwise():
    spec = hvd.Compression.topk(0.05, 0.02, min_size=256)
    data = batches(hvd.rank(), 9)

    def make(model):
        return topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=0.05,
                                                           momentum=0.9))

    model = initial_model()
    opt = make(model)
    train(model, opt, data[:3])
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    assert saved_opt["hvdx_topk"]["step"] == 3 and saved_opt["hvdx_topk"]["worker"]
    train(model, opt, data[3:6])

    resumed = SmallCNN()
    resumed.load_state_dict(saved_model)
    opt2 = make(resumed)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, data[3:6])
    for (name, a), b in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), f"{name} differs after resuming"
    assert same_everywhere(model.fc1.weight)


@pytest.mark.mpi(min_size=1)
def test_residuals_hold_gradients_so_a_learning_rate_change_does_not_rescale_them():
    spec = hvd.Compression.topk(0.02, 0.01, min_size=0)
    rank = hvd.rank()

    def residuals_after(lrs):
        model = Flat(dtype=torch.float64)
        opt = topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=lrs[0]))
        for step, lr in enumerate(lrs):
            for group in opt.param_groups:
                group["lr"] = lr
            model.w.grad = torch.from_numpy(grads_of_all_ranks(step)[rank].astype(np.float64))
            opt.step()
        return [residual(opt, side).copy() for side in ("worker", "server")], model.w

    (worker_a, server_a), w_a = residuals_after([0.1, 0.1, 0.1])
    (worker_b, server_b), w_b = residuals_after([0.1, 10.0, 0.001])
    np.testing.assert_array_equal(worker_a, worker_b)
    np.testing.assert_array_equal(server_a, server_b)
    assert not torch.equal(w_a, w_b)  # the learning rates did change the parameters


@pytest.mark.mpi(min_size=2)
def test_loading_another_ranks_residuals_fails_naming_both_ranks_and_changes_nothing():
    # The Horovod habit, save on rank 0 and load everywhere, would give every rank rank
    # 0's residuals: every other rank refuses, before anything is loaded.
    spec = hvd.Compression.topk(0.05, 0.02, min_size=256)
    model = initial_model()
    opt = topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=0.05,
                                                      momentum=0.9))
    train(model, opt, batches(hvd.rank(), 2))
    mine = copy.deepcopy(opt.state_dict())
    rank0 = hvd.broadcast_object(mine, root_rank=0, name="check.rank0_state")
    if hvd.rank() == 0:
        opt.load_state_dict(rank0)
        return
    with pytest.raises(ValueError, match=f"residuals of rank 0 and this is rank {hvd.rank()}"):
        opt.load_state_dict(rank0)
    after = opt.state_dict()
    for side in ("worker", "server"):
        for name, e in mine["hvdx_topk"][side].items():
            assert torch.equal(after["hvdx_topk"][side][name], e), name
    assert after["state"].keys() == mine["state"].keys()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("correction", [False, True])
def test_small_tensors_averaged_by_hvdx_are_horovods_average_and_horovod_idles(correction):
    def one_step(small_tensors):
        model = initial_model()
        spec = hvd.Compression.topk(0.05, 0.05, min_size=256, small_tensors=small_tensors,
                                    momentum_correction=correction)
        opt = topk_optimizer(model, spec, torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9 if correction else 0))
        asked, horovods = [], opt._hvdx_dense_async
        opt._hvdx_dense_async = lambda name, p: asked.append(name) or horovods(name, p)
        (x, y), = batches(hvd.rank(), 1)
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        return model, opt, asked

    by_horovod, opt_horovod, asked_horovod = one_step("horovod_allreduce")
    by_hvdx, opt_hvdx, asked_hvdx = one_step("in_topk_step")
    small = [n for n, p in by_hvdx.named_parameters() if p.numel() < 256]
    assert small and sorted(asked_horovod) == sorted(small) and asked_hvdx == []
    for (name, a), b in zip(by_horovod.named_parameters(), by_hvdx.parameters()):
        if name in small:  # one MPI allreduce instead of Horovod's: float32 rounding
            torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-6)
            assert same_everywhere(b.grad), name
        else:
            assert torch.equal(b.grad, a.grad), name
    for stats in ("last_sent", "last_received", "last_sparse_tensors", "last_dense_tensors"):
        assert getattr(opt_hvdx.hvdx_stats, stats) == getattr(opt_horovod.hvdx_stats, stats)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.02),
], ids=["sgd_momentum", "adam"])
def test_training_reduces_the_loss(make_optimizer):
    model = initial_model()
    opt = topk_optimizer(model, hvd.Compression.topk(0.05, 0.05),  # min_size 1024
                         make_optimizer(model.parameters()))
    assert isinstance(opt, type(make_optimizer([nn.Parameter(torch.zeros(1))])))
    losses = []
    train(model, opt, batches(hvd.rank(), 1) * 25, losses)
    # The mean over ranks of each rank's loss on its own batch.
    losses = horovod.torch.allreduce(torch.tensor(losses), name="check.losses").tolist()
    assert losses[-1] < 0.8 * losses[0], losses
    assert opt.hvdx_stats.last_sparse_tensors == 1  # fc1.weight (4096 entries)
    if hvd.size() > 1:
        assert opt.hvdx_stats.last_sent > 0 and opt.hvdx_stats.total_received > 0
    for p in model.parameters():
        assert same_everywhere(p)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_gradients_are_upcast_and_written_back_in_their_dtype(dtype):
    model = Flat(dtype=dtype)
    opt = topk_optimizer(model, hvd.Compression.topk(1.0, 1.0, min_size=0))
    g = torch.from_numpy(grads_of_all_ranks(0)[hvd.rank()]).to(dtype)
    dense = horovod.torch.allreduce(g.float(), op=hvd.Average, name=f"check.{dtype}")
    model.w.grad = g.clone()
    opt.step()
    assert model.w.grad.dtype == dtype
    assert torch.equal(model.w.grad, dense.to(dtype))
    assert residual(opt, "worker").dtype == np.float32


@pytest.mark.mpi(min_size=1)
def test_op_sum_is_size_times_the_average():
    a, b = Flat(), Flat()
    opt_avg = topk_optimizer(a, hvd.Compression.topk(0.1, 0.1, min_size=0))
    opt_sum = topk_optimizer(b, hvd.Compression.topk(0.1, 0.1, min_size=0), op=hvd.Sum)
    g = torch.from_numpy(grads_of_all_ranks(0)[hvd.rank()].copy())
    a.w.grad, b.w.grad = g.clone(), g.clone()
    opt_avg.step()
    opt_sum.step()
    assert torch.equal(b.w.grad, a.w.grad * hvd.size())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kwargs, message", [
    ({"ratio": 0.0}, "ratio=0.0 must be in"),
    ({"ratio": 1.01}, "ratio=1.01 must be in"),
    ({"ratio": 0.1, "downlink_ratio": -1}, "downlink_ratio=-1 must be in"),
])
def test_a_bad_ratio_is_refused_at_construction(kwargs, message):
    refused(lambda: hvd.Compression.topk(**kwargs), message)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("op, name", [(hvd.Adasum, "Adasum"), (hvd.Min, "Min")])
def test_unsupported_ops_are_rejected(op, name):
    with pytest.raises(ValueError, match=f"op={name} is not supported with TopK"):
        topk_optimizer(Flat(), hvd.Compression.topk(0.1), op=op)


@pytest.mark.mpi(min_size=2)
def test_different_ratios_raise_the_fingerprint_error_on_every_rank():
    spec = hvd.Compression.topk(0.01 if hvd.rank() != 1 else 0.02, 0.01)
    with pytest.raises(ValueError, match="setting 'compression' differs") as info:
        topk_optimizer(Flat(), spec)
    message = str(info.value)
    assert "topk ratio=0.01 " in message and "topk ratio=0.02 " in message
    assert len(set(hvd.allgather_object(message))) == 1


@pytest.mark.mpi(min_size=1)
def test_finite_gradients_whose_sum_overflows_are_not_taken_for_inf():
    from hvdx.torch.finite import first_nonfinite

    big = torch.full((8,), 3e38)
    half = torch.full((8,), 6e4, dtype=torch.float16)
    assert first_nonfinite([big, half]) == 2
    assert first_nonfinite([big, torch.tensor([1.0, float("nan")])]) == 1


def topk_state(opt):
    """Copies of everything a TopK step may change, besides the gradients: the residuals,
    the velocity, the step counter, autotune's timings and the byte counters."""
    sync = opt._hvdx_sync
    return {"worker": opt._hvdx_worker.state_dict(), "server": opt._hvdx_server.state_dict(),
            "velocity": {n: v.detach().clone() for n, v in opt._hvdx_velocity.items()},
            "step": sync.step, "timings": list(sync.timings),
            "stats": copy.deepcopy(opt.hvdx_stats.as_dict())}


def assert_same_state(after, before):
    for side in ("worker", "server"):
        assert list(after[side]) == list(before[side])
        assert all(np.array_equal(after[side][n], before[side][n]) for n in before[side])
    assert list(after["velocity"]) == list(before["velocity"])
    assert all(torch.equal(after["velocity"][n], v) for n, v in before["velocity"].items())
    assert {k: after[k] for k in ("step", "timings", "stats")} == \
        {k: before[k] for k in ("step", "timings", "stats")}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("correction", [False, True])
def test_an_inf_gradient_on_one_rank_makes_every_ranks_gradients_nan_and_changes_no_state(
        correction, capfd):
    """As Horovod's allreduce carries an inf into every rank's average, every rank's
    gradients come back non-finite, so that a loss scaler skips the step on every rank;
    no residual, velocity, step counter or byte counter takes the bad gradient in, and
    rank 0 reports it once. (Such a step used to raise ValueError on every rank, which
    ended every mixed-precision run at its first overflow.)"""
    model = initial_model()
    opt = topk_optimizer(
        model, hvd.Compression.topk(0.05, 0.05, min_size=256, momentum_correction=correction),
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9 if correction else 0))
    data = batches(hvd.rank(), 2)
    train(model, opt, data[:1])
    before = topk_state(opt)
    assert bool(before["velocity"]) == correction and before["step"] == 1
    params = copy.deepcopy(model.state_dict())
    bad_rank = hvd.size() - 1
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(data[1][0]), data[1][1]).backward()
        if hvd.rank() == bad_rank:
            model.fc2.weight.grad[0, 0] = float("inf")
        opt.synchronize()
        for name, p in model.named_parameters():
            assert torch.isnan(p.grad).all(), f"{name}: an entry is not NaN"
        assert_same_state(topk_state(opt), before)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in params.items())
    reports = capfd.readouterr().err.count("[hvdx] TopK: the gradient of 'fc2.weight'")
    assert reports == (1 if hvd.rank() == 0 else 0)
    # A finite step then trains on from the state before the skipped ones.
    opt.zero_grad()
    F.cross_entropy(model(data[1][0]), data[1][1]).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    assert opt._hvdx_sync.step == 2
    assert all(bool(torch.isfinite(p).all()) and same_everywhere(p) for p in model.parameters())


AMP_D, AMP_K_UP, AMP_K_DOWN, AMP_LR, AMP_SCALE = 8, 2, 1, 2.0 ** -4, 2.0 ** 90
AMP_STEPS, AMP_OVERFLOWS = 6, (1, 2)


def amp_gradient(rank, step):
    """Rank ``rank``'s unscaled gradient at ``step``: distinct integers, so that scaled
    by a power of two, summed and averaged over 1, 2 or 4 ranks, every value stays exact
    in float32. The last rank's is 2**50 times larger at ``AMP_OVERFLOWS``: scaled by
    ``AMP_SCALE`` (or half or a quarter of it) it overflows float32."""
    rng = np.random.default_rng(100 * step + rank)
    g = rng.choice(np.arange(1, 1000), AMP_D, replace=False) * rng.choice([-1, 1], AMP_D)
    if rank == hvd.size() - 1 and step in AMP_OVERFLOWS:
        g = g * 2.0 ** 50
    return g.astype(np.float32)


def top(a, k):
    """``a`` with all but its ``k`` largest magnitudes zeroed (they never tie here)."""
    order = np.argsort(-np.abs(a), kind="stable")
    assert abs(a[order[k - 1]]) > abs(a[order[k]]), "a tie: the test's values must differ"
    kept = np.zeros_like(a)
    kept[order[:k]] = a[order[:k]]
    return kept


def amp_reference(size):
    """A plain single-process run of the AMP recipe on every rank's gradients: a step
    whose scaled gradients overflow float32 anywhere is skipped and halves the scale;
    the others send each rank's top ``AMP_K_UP`` of its residual plus its scaled
    gradient, keep the rest as its residual, and apply the top ``AMP_K_DOWN`` of the
    server residual plus their average, unscaled, with SGD. Float64: every value is
    exact, as it is in float32."""
    w, scale = np.zeros(AMP_D), AMP_SCALE
    workers, server, skipped = np.zeros((size, AMP_D)), np.zeros(AMP_D), []
    for t in range(AMP_STEPS):
        g = np.array([amp_gradient(r, t) for r in range(size)], np.float64) * scale
        if np.abs(g).max() >= 2.0 ** 128:  # beyond float32: inf
            skipped.append(t)
            scale /= 2
            continue
        sent = np.array([top(workers[r] + g[r], AMP_K_UP) for r in range(size)])
        workers += g - sent
        b = server + sent.sum(axis=0) / size
        u = top(b, AMP_K_DOWN)
        server = b - u
        w -= AMP_LR * (u / scale)
    return w, skipped, scale, workers


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
def test_amp_grad_scaler_skips_an_overflow_on_one_rank_on_every_rank_and_trains_as_without_it(
        mode):
    """Horovod's AMP recipe (``synchronize``, then ``scaler.step`` inside
    ``skip_synchronize``, then ``scaler.update``) with ``torch.amp.GradScaler`` on CPU and
    a loss scale so large that the last rank's gradients overflow at two steps: every
    rank skips those steps, halves its scale twice, and ends with the parameters and the
    residuals of a plain run that never took the skipped steps."""
    size, rank = hvd.size(), hvd.rank()
    model = Flat(AMP_D)
    spec = hvd.Compression.topk(AMP_K_UP / AMP_D, AMP_K_DOWN / AMP_D, mode=mode, min_size=0)
    opt = topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=AMP_LR))
    scaler = torch.amp.GradScaler("cpu", init_scale=AMP_SCALE)
    skipped = []
    for t in range(AMP_STEPS):
        opt.zero_grad()
        scaler.scale((model.w * torch.from_numpy(amp_gradient(rank, t))).sum()).backward()
        opt.synchronize()
        before, scale = model.w.detach().clone(), scaler.get_scale()
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale:
            assert torch.equal(model.w, before)  # the wrapped SGD did not step
            skipped.append(t)
    w, expected_skipped, expected_scale, workers = amp_reference(size)
    assert skipped == expected_skipped == list(AMP_OVERFLOWS)
    assert scaler.get_scale() == expected_scale
    assert opt._hvdx_sync.step == AMP_STEPS - len(AMP_OVERFLOWS)
    assert same_everywhere(model.w)
    assert np.array_equal(model.w.detach().numpy(), w.astype(np.float32))
    assert np.array_equal(residual(opt, "worker"), workers[rank].astype(np.float32))


@pytest.mark.mpi(min_size=1)
def test_subclassing_the_returned_class_does_not_recurse():
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.1, min_size=0))
    sub = type("Sub", (type(opt),), {})
    assert issubclass(sub, torch.optim.SGD)
    assert hvd.Compression.none is horovod.torch.Compression.none
    assert hvd.Compression.fp16 is horovod.torch.Compression.fp16


@pytest.mark.mpi(min_size=1)
def test_warmup_steps_are_dense_and_leave_no_residual():
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.01, 0.01, min_size=0,
                                                     warmup_steps=1))
    g = torch.from_numpy(grads_of_all_ranks(0)[hvd.rank()].copy())
    dense = horovod.torch.allreduce(g, op=hvd.Average, name="check.warmup")
    model.w.grad = g.clone()
    opt.step()
    assert torch.equal(model.w.grad, dense)  # the same Horovod allreduce
    assert residual(opt, "worker") is None and opt.hvdx_stats.last_dense_tensors == 1
    model.w.grad = g.clone()
    opt.step()
    assert opt.hvdx_stats.last_sparse_tensors == 1
    assert np.count_nonzero(model.w.grad.numpy()) <= 30


@pytest.mark.mpi(min_size=1)
def test_sparsity_warm_up_sends_dgcs_falling_ratios_after_the_dense_steps():
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.01, 0.01, min_size=0, warmup_steps=1,
                                                     sparsity_warmup_steps=2))
    sent = []
    for step in range(4):
        model.w.grad = torch.from_numpy(grads_of_all_ranks(step)[hvd.rank()].copy())
        opt.step()
        sent.append(None if opt.hvdx_stats.last_dense_tensors else
                    len(opt._hvdx_sync.last_sent[0]))
    assert sent == [None, math.ceil(0.25 * D), math.ceil(math.sqrt(0.25 * 0.01) * D),
                    math.ceil(0.01 * D)]
    assert same_everywhere(model.w)


def step_with(opt, model, step):
    """One step on the synthetic gradient; returns Horovod's dense average of it."""
    g = torch.from_numpy(grads_of_all_ranks(step)[hvd.rank()].copy())
    dense = horovod.torch.allreduce(g, op=hvd.Average, name=f"check.autotune.{step}")
    model.w.grad = g.clone()
    opt.step()
    return dense


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
def test_autotune_steps_train_dense_and_their_dry_runs_leave_no_residual(mode):
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.01, 0.01, mode=mode, min_size=0,
                                                     autotune_steps=2))
    for step in range(2):
        dense = step_with(opt, model, step)
        assert torch.equal(model.w.grad, dense)  # Horovod's own allreduce
        assert residual(opt, "worker") is None and residual(opt, "server") is None
        assert opt._hvdx_sync.last_sent == {}
    tuned = opt.hvdx_stats.autotune
    assert tuned["choice"] in ("topk", "dense") and tuned["dense_s"] > 0 < tuned["topk_s"]
    assert gather_all(torch.tensor([int(tuned["choice"] == "topk")])).unique().numel() == 1
    assert (opt.hvdx_stats.phases["up"][0] > 0) == (hvd.size() > 1)  # dry runs' pairs travel
    step_with(opt, model, 2)
    assert opt.hvdx_stats.last_sparse_tensors == (1 if tuned["choice"] == "topk" else 0)
    assert same_everywhere(model.w)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_autotune_times_topk_at_the_target_ratio_not_the_sparsity_warmups_first(mode):
    # With sparsity_warmup_steps the first compressed steps send 25% of the entries; the
    # dry runs must time what the run sends afterwards: 1%, as without the warm-up.
    sent = []
    for warmup in (0, 50):
        model = Flat()
        opt = topk_optimizer(model, hvd.Compression.topk(
            0.01, 0.01, mode=mode, min_size=0, autotune_steps=1,
            sparsity_warmup_steps=warmup))
        step_with(opt, model, 0)
        sent.append(opt.hvdx_stats.phases["up"][0])
    assert sent[0] == sent[1] > 0
    assert sent[1] < 2 * (hvd.size() - 1) * 8 * 0.01 * D + 64 * hvd.size()  # not 25%


@pytest.mark.mpi(min_size=2)
@pytest.mark.all_sizes
def test_autotune_decides_on_the_slowest_rank_and_stays_dense_when_topk_lost():
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.01, 0.01, min_size=0,
                                                     autotune_steps=3))
    sync = opt._hvdx_sync
    # TopK is faster on rank 0 only: the slowest rank's 2 s decides, on every rank.
    sync.timings = [(1.0, 0.5)] * 3 if hvd.rank() == 0 else [(1.0, 2.0)] * 3
    sync.step = 3
    assert sync.decide() == "dense"
    assert opt.hvdx_stats.autotune == {"dense_s": 1.0, "topk_s": 2.0, "choice": "dense"}
    for step in range(3, 5):
        assert torch.equal(step_with(opt, model, step), model.w.grad)
    state = copy.deepcopy(opt.state_dict())
    again = topk_optimizer(Flat(), hvd.Compression.topk(0.01, 0.01, min_size=0,
                                                        autotune_steps=3))
    again.load_state_dict(state)
    assert again._hvdx_sync.choice == "dense"  # a resumed run keeps the decision


def chose_dense(opt):
    """Give ``opt`` the decision autotune takes when the dense allreduce was faster."""
    sync = opt._hvdx_sync
    sync.timings, sync.step = [(1.0, 2.0)] * sync.compression.autotune_steps, \
        sync.compression.autotune_steps
    assert sync.decide() == "dense"
    opt._hvdx_register_hooks()  # what the deciding step does at its end


def train_watching_backward(model, opt, data, passes=1):
    """Train; return, per step, how many allreduces had started when backward ended."""
    started = []
    for x, y in data:
        opt.zero_grad()
        for _ in range(passes):
            F.cross_entropy(model(x), y).backward()
        started.append(len(getattr(opt, "_hvdx_handles", ())))
        opt.step()
    return started


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("passes", [1, 2])
def test_once_autotune_chose_dense_allreduces_start_during_backward_as_horovods(passes):
    """After a dense decision the step is Horovod's: every gradient's allreduce starts
    from a hook while backward runs (after the last of ``backward_passes_per_step``
    passes), and training follows Horovod's own DistributedOptimizer."""
    model, reference = initial_model(), initial_model()
    opt = topk_optimizer(model, hvd.Compression.topk(0.05, 0.05, min_size=0, autotune_steps=2),
                         torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                         backward_passes_per_step=passes)
    chose_dense(opt)
    opt._hvdx_comm = NoCollectives()  # no collective of hvdx's own, not even NaN's
    horovod_opt = horovod.torch.DistributedOptimizer(
        torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9),
        named_parameters=reference.named_parameters(), backward_passes_per_step=passes)
    data = batches(hvd.rank(), 4, seed=8)
    started = train_watching_backward(model, opt, data, passes)
    train_watching_backward(reference, horovod_opt, data, passes)
    entries = len(list(model.parameters()))
    assert started == [entries] * len(data)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
        assert same_everywhere(a), name
    assert opt.hvdx_stats.steps == len(data) and opt.hvdx_stats.last_sparse_tensors == 0
    assert opt._hvdx_handles == {}


@pytest.mark.mpi(min_size=1)
def test_a_dense_choice_with_momentum_correction_trains_as_sgd_with_momentum():
    model, reference = initial_model(), initial_model()
    spec = hvd.Compression.topk(0.05, min_size=0, autotune_steps=1, momentum_correction=True)
    opt = topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=0.05,
                                                      momentum=0.9, weight_decay=1e-3))
    chose_dense(opt)
    assert_same_training(model, opt, reference, horovod_sgd(reference, 0.9, 1e-3))


@pytest.mark.mpi(min_size=1)
def test_autotune_steps_with_momentum_correction_are_sgd_with_momentum_then_decide():
    """The tuning steps are dense (SGD's momentum on Horovod's average) while their dry
    runs time the exchange of the gradients, which have no velocity of their own yet."""
    model, reference = initial_model(), initial_model()
    spec = hvd.Compression.topk(0.05, min_size=256, autotune_steps=2,
                                momentum_correction=True)
    opt = corrected_with(model, spec)
    assert_same_training(model, opt, reference, horovod_sgd(reference, 0.9, 1e-3), steps=2)
    assert opt._hvdx_sync.choice in ("topk", "dense")
    assert same_everywhere(torch.tensor([opt._hvdx_sync.choice == "topk"]))
    train(model, opt, batches(hvd.rank(), 1, seed=9))  # the first step after the decision


@pytest.mark.mpi(min_size=1)
def test_a_resumed_dense_choice_overlaps_from_its_first_step():
    model = initial_model()
    spec = hvd.Compression.topk(0.05, min_size=0, autotune_steps=1)
    opt = topk_optimizer(model, spec)
    chose_dense(opt)
    again = topk_optimizer(model, spec)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    del opt  # its hooks hold it weakly: they go quiet with it
    gc.collect()
    entries = len(list(model.parameters()))
    assert train_watching_backward(model, again, batches(hvd.rank(), 2)) == [entries] * 2


@pytest.mark.mpi(min_size=1)
def test_synchronize_then_skip_synchronize_for_gradient_clipping():
    model = Flat()
    opt = topk_optimizer(model, hvd.Compression.topk(0.1, 0.1, min_size=0),
                         torch.optim.SGD(model.parameters(), lr=1.0))
    model.w.grad = torch.from_numpy(grads_of_all_ranks(0)[hvd.rank()].copy())
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    update = model.w.grad.clone()
    with opt.skip_synchronize():
        opt.step()
    assert torch.equal(model.w.detach(), -update)
    assert opt.hvdx_stats.steps == 1 and same_everywhere(model.w)


@pytest.mark.mpi(min_size=1)
def test_sparse_gradients_fall_back_to_horovods_dense_average():
    torch.manual_seed(0)
    embedding = nn.Embedding(100, 16, sparse=True)  # 1600 entries, above min_size
    hvd.broadcast_parameters(embedding.state_dict(), root_rank=0)
    opt = topk_optimizer(embedding, hvd.Compression.topk(0.01, 0.01, min_size=1000),
                         torch.optim.SGD(embedding.parameters(), lr=0.5))
    ids = torch.tensor([hvd.rank(), 50 + hvd.rank()])
    embedding(ids).sum().backward()
    expected = horovod.torch.allreduce(embedding.weight.grad.to_dense(), op=hvd.Average,
                                       name="check.sparse")
    opt.step()
    assert embedding.weight.grad.is_sparse
    assert torch.equal(embedding.weight.grad.to_dense(), expected)
    assert opt.hvdx_stats.last_dense_tensors == 1 and same_everywhere(embedding.weight)


@pytest.mark.mpi(min_size=1)
def test_a_sparse_gradient_of_a_skipped_step_comes_back_sparse_and_all_nan():
    """In the form Horovod's average gives it back (densified, then sparse again)."""
    embedding = nn.Embedding(100, 16, sparse=True)
    opt = topk_optimizer(embedding, hvd.Compression.topk(0.01, 0.01, min_size=1000))
    embedding(torch.tensor([hvd.rank()])).sum().backward()
    if hvd.rank() == hvd.size() - 1:
        embedding.weight.grad = embedding.weight.grad * float("inf")
    opt.synchronize()
    g = embedding.weight.grad
    assert g.is_sparse and g.shape == (100, 16) and torch.isnan(g.to_dense()).all()
    assert opt.hvdx_stats.steps == 0


SIZES = (3000, 1, 3, 517, 1234)  # 1 and 3 leave some shards empty on 4 ranks


class Several(nn.Module):
    def __init__(self, sizes=SIZES):
        super().__init__()
        for t, d in enumerate(sizes):
            setattr(self, f"w{t}", nn.Parameter(torch.zeros(d)))


class CountingComm:
    """Passes every call to ``comm`` and counts the collectives (a non-blocking one,
    ``Iallgather``, counts as its blocking name: hvdx starts them and sleeps while they
    complete)."""

    COLLECTIVES = ("allgather", "Allgather", "Allgatherv", "Alltoall", "Alltoallv")

    def __init__(self, comm):
        self.comm, self.calls = comm, []

    def __getattr__(self, name):
        attribute = getattr(self.comm, name)
        blocking = name[1].upper() + name[2:] if name.startswith("I") else name
        if blocking in self.COLLECTIVES:
            def counted(*args, **kwargs):
                self.calls.append(blocking)
                return attribute(*args, **kwargs)
            return counted
        return attribute


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", RATIOS)
def test_several_tensors_fused_equal_the_per_tensor_reference_bitwise(mode, direction):
    ratio, downlink_ratio = RATIOS[direction]
    model = Several()
    opt = topk_optimizer(model, hvd.Compression.topk(ratio, downlink_ratio, mode=mode,
                                                     min_size=0))
    counting = opt._hvdx_comm = CountingComm(opt._hvdx_comm)
    size, rank = hvd.size(), hvd.rank()
    config = TopKConfig(ratio, downlink_ratio)
    names = [f"w{t}" for t in range(len(SIZES))]
    workers = [ResidualMemory(names) for _ in range(size)]
    servers = [ResidualMemory(names) for _ in range(size)]
    for step in range(3):
        grads = {n: grads_of_all_ranks(step, d, seed=10 + t)
                 for t, (n, d) in enumerate(zip(names, SIZES))}
        for n in names:
            getattr(model, n).grad = torch.from_numpy(grads[n][rank].copy())
        counting.calls.clear()
        agreed = opt.hvdx_stats.phases["agree"][1]
        opt.step()
        agreed = opt.hvdx_stats.phases["agree"][1] - agreed
        # A fixed number of collectives, whatever the number of tensors: the NaN check,
        # then (counts, pairs) once (gathered) or twice (sharded); sharded bidirectional
        # agrees on the global TopK in between, all tensors at once, in a few rounds,
        # each an allgather of the lengths and one of the values (non-blocking, waited
        # for with sleeps: a pickled allgather spins).
        expected = ["Allgather", "Allgather", "Allgatherv"] if mode == "gathered" else \
            ["Allgather", "Alltoall", "Alltoallv", "Allgather", "Allgatherv"]
        calls = counting.calls
        if mode == "sharded" and downlink_ratio is not None:
            agreement, calls = calls[3:-2], calls[:3] + calls[-2:]
            rounds = len(agreement) // 2
            assert agreement == ["Allgather", "Allgatherv"] * rounds and 1 <= rounds <= 9
        assert calls == expected
        received, nnz_up = 0, 0
        for n in names:
            ref = simulate_step(grads[n], workers, servers, config, mode, step=step, name=n)
            assert np.array_equal(getattr(model, n).grad.numpy(), ref.u), f"{n}, step {step}"
            assert np.array_equal(opt._hvdx_worker.get(n), workers[rank].get(n))
            if downlink_ratio is not None:
                assert np.array_equal(opt._hvdx_server.get(n), servers[rank].get(n))
            received += ref.stats.recv_bytes[rank]
            nnz_up += ref.stats.nnz_up[rank]
        collectives = 1 if mode == "gathered" else 2
        stats = opt.hvdx_stats
        assert stats.last_sparse_tensors == len(SIZES)
        assert stats.last_received - agreed == received + collectives * 8 * (size - 1)
        if mode == "gathered":
            assert stats.last_sent == (size - 1) * 8 * (nnz_up + 1)
        for n in names:
            assert same_everywhere(getattr(model, n).grad)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", RATIOS)
def test_without_error_feedback_no_residual_is_kept_and_u_is_plain_topk(mode, direction):
    ratio, downlink_ratio = RATIOS[direction]
    model = Flat()
    spec = hvd.Compression.topk(ratio, downlink_ratio, mode=mode, min_size=0,
                                error_feedback=False)
    assert " error_feedback=False" in spec.describe()
    opt = topk_optimizer(model, spec)
    size, rank = hvd.size(), hvd.rank()
    config = TopKConfig(ratio, downlink_ratio)
    for step in range(3):
        grads = grads_of_all_ranks(step)
        model.w.grad = torch.from_numpy(grads[rank].copy())
        opt.step()
        # The reference with fresh (zero) residuals at every step is plain TopK.
        ref = simulate_step(grads, [ResidualMemory(["w"]) for _ in range(size)],
                            [ResidualMemory(["w"]) for _ in range(size)], config, mode,
                            step=step, name="w")
        u = model.w.grad.numpy()
        assert np.array_equal(u, ref.u), f"step {step}"
        if downlink_ratio is None:  # u is the mean of every rank's TopK of its gradient
            k = config.k_up(D)
            plain = np.zeros(D, np.float32)
            for g in grads:
                top = np.argsort(-np.abs(g), kind="stable")[:k]
                plain[top] += g[top]
            np.testing.assert_array_equal(u, plain / np.float32(size))
        assert residual(opt, "worker") is None and residual(opt, "server") is None
        state = opt.state_dict()["hvdx_topk"]
        assert not any(e is not None and np.any(e.numpy())
                       for side in ("worker", "server") for e in state[side].values())


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("direction", RATIOS)
def test_global_selection_equals_the_reference_on_the_concatenated_gradient(mode, direction):
    """selection="global": one k over all compressed tensors, i.e. bitwise the numpy
    reference run on their concatenation (fixed order), cut back into the tensors."""
    ratio, downlink_ratio = RATIOS[direction]
    model = Several()
    opt = topk_optimizer(model, hvd.Compression.topk(ratio, downlink_ratio, mode=mode,
                                                     min_size=2, selection="global"))
    size, rank = hvd.size(), hvd.rank()
    config = TopKConfig(ratio, downlink_ratio)
    compressed = [(f"w{t}", d) for t, d in enumerate(SIZES) if d >= 2]
    workers = [ResidualMemory(["all"]) for _ in range(size)]
    servers = [ResidualMemory(["all"]) for _ in range(size)]
    per_tensor_nnz = []
    for step in range(3):
        grads = {n: grads_of_all_ranks(step, d, seed=20 + t)
                 for t, (n, d) in enumerate(zip([f"w{t}" for t in range(len(SIZES))], SIZES))}
        for n, g in grads.items():
            getattr(model, n).grad = torch.from_numpy(g[rank].copy())
        dense_w1 = horovod.torch.allreduce(model.w1.grad, op=hvd.Average, name=f"w1.{step}")
        opt.step()
        whole = [np.concatenate([grads[n][r] for n, _ in compressed]) for r in range(size)]
        ref = simulate_step(whole, workers, servers, config, mode, step=step, name="all")
        got = np.concatenate([getattr(model, n).grad.numpy() for n, _ in compressed])
        assert np.array_equal(got, ref.u), f"step {step}"
        assert np.count_nonzero(got) <= config.k_down(got.size) if downlink_ratio \
            else True
        assert torch.equal(model.w1.grad, dense_w1)  # 1 entry < min_size: dense
        assert np.array_equal(opt._hvdx_worker.get("hvdx.global"), workers[rank].get("all"))
        per_tensor_nnz.append([int(np.count_nonzero(getattr(model, n).grad.numpy()))
                               for n, _ in compressed])
        for n, _ in compressed:
            assert same_everywhere(getattr(model, n).grad)
    # One k over all: the tensors' shares follow their magnitudes, not their sizes.
    layerwise = [config.k_up(d) for _, d in compressed]
    assert any(nnz != layerwise for nnz in per_tensor_nnz)


@pytest.mark.mpi(min_size=1)
def test_global_selection_checkpoints_and_resumes_bitwise():
    compression = hvd.Compression.topk(0.02, 0.01, selection="global", min_size=0)
    first = Several()
    opt = topk_optimizer(first, compression)
    for step in range(2):
        for t, d in enumerate(SIZES):
            getattr(first, f"w{t}").grad = torch.from_numpy(
                grads_of_all_ranks(step, d, seed=30 + t)[hvd.rank()].copy())
        opt.step()
    state = copy.deepcopy(opt.state_dict())
    assert [n for n, _ in state["hvdx_topk"]["layout"]] == [f"w{t}" for t in range(len(SIZES))]
    second = Several()
    resumed = topk_optimizer(second, compression)
    resumed.load_state_dict(state)
    for step in range(2, 4):
        for model, o in ((first, opt), (second, resumed)):
            for t, d in enumerate(SIZES):
                getattr(model, f"w{t}").grad = torch.from_numpy(
                    grads_of_all_ranks(step, d, seed=30 + t)[hvd.rank()].copy())
            o.step()
        for t in range(len(SIZES)):
            assert torch.equal(getattr(first, f"w{t}").grad, getattr(second, f"w{t}").grad)
    layerwise = topk_optimizer(Several(), hvd.Compression.topk(0.02, 0.01, min_size=0))
    with pytest.raises(ValueError, match="selection='global'"):
        layerwise.load_state_dict(state)


@pytest.mark.mpi(min_size=1)
@pytest.mark.all_sizes
@pytest.mark.parametrize("mode", MODES)
def test_byte_counters_split_into_uplink_downlink_and_dense(mode):
    model = Several()
    opt = topk_optimizer(model, hvd.Compression.topk(0.02, 0.01, mode=mode, min_size=4))
    for t, d in enumerate(SIZES):
        getattr(model, f"w{t}").grad = torch.from_numpy(
            grads_of_all_ranks(0, d, seed=40 + t)[hvd.rank()].copy())
    opt.step()
    stats = opt.hvdx_stats
    phases = stats.phases
    assert sum(s for s, _ in phases.values()) == pytest.approx(stats.total_sent)
    assert sum(r for _, r in phases.values()) == pytest.approx(stats.total_received)
    assert phases["dense"][0] == pytest.approx(2 * (hvd.size() - 1) / hvd.size() * 4 * (1 + 3))
    if mode == "gathered" or hvd.size() == 1:
        assert phases["down"] == [0.0, 0.0]  # every rank computes the downlink itself
        assert phases["agree"] == [0.0, 0.0]
    else:
        assert phases["down"][1] > 0
        assert phases["agree"][1] > 0  # the shards agree on the global downlink TopK


def horovod_sgd(model, momentum, weight_decay):
    return horovod.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum,
                        weight_decay=weight_decay),
        named_parameters=model.named_parameters())


def corrected(model, **topk):
    return corrected_with(model, hvd.Compression.topk(momentum_correction=True, **topk))


def corrected_with(model, spec):
    return topk_optimizer(model, spec, torch.optim.SGD(model.parameters(), lr=0.05,
                                                       momentum=0.9, weight_decay=1e-3))


def assert_same_training(a, opt_a, b, opt_b, steps=4):
    data = batches(hvd.rank(), steps, seed=5)
    train(a, opt_a, data)
    train(b, opt_b, data)
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=1e-6), name


@pytest.mark.mpi(min_size=1)
def test_momentum_correction_leaves_dense_tensors_as_sgd_with_momentum_under_horovod():
    """Every tensor below min_size: averaged, then SGD's own momentum and weight decay."""
    model, reference = initial_model(), initial_model()
    assert_same_training(model, corrected(model, ratio=0.05, min_size=10**9),
                         reference, horovod_sgd(reference, 0.9, 1e-3))


@pytest.mark.mpi(min_size=1)
def test_momentum_correction_at_ratio_one_masks_the_whole_velocity_plain_sgd():
    """DGC's factor masking zeroes the velocity wherever it was sent; at ratio 1 all of
    it is sent every step, so what remains is SGD without momentum on the average."""
    model, reference = initial_model(), initial_model()
    opt = corrected(model, ratio=1.0, downlink_ratio=1.0, min_size=0)
    assert_same_training(model, opt, reference, horovod_sgd(reference, 0.0, 1e-3))
    assert all(not v.any() for v in opt._hvdx_velocity.values())


@pytest.mark.mpi(min_size=1)
def test_momentum_correction_without_masking_at_ratio_one_is_sgd_with_momentum():
    """momentum_masking=False keeps the velocity where it was sent: at ratio 1 every
    rank sends its whole velocity, whose average is the velocity of the average."""
    model, reference = initial_model(), initial_model()
    opt = corrected(model, ratio=1.0, downlink_ratio=1.0, min_size=0, momentum_masking=False)
    assert_same_training(model, opt, reference, horovod_sgd(reference, 0.9, 1e-3))
    assert all(v.any() for v in opt._hvdx_velocity.values())


@pytest.mark.mpi(min_size=1)
def test_momentum_correction_keeps_unsent_velocity_and_resumes_bitwise():
    data = batches(hvd.rank(), 6, seed=6)
    model = initial_model()
    opt = corrected(model, ratio=0.05, downlink_ratio=0.02, min_size=256)
    train(model, opt, data[:3])
    velocity = opt._hvdx_velocity["fc1.weight"]
    sent = opt._hvdx_sync.last_sent[2]  # fc1.weight: conv.weight, conv.bias come first
    assert not velocity.view(-1)[torch.from_numpy(sent)].any()
    assert velocity.count_nonzero() > velocity.numel() // 2  # the rest keeps its momentum
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    assert set(saved_opt["hvdx_topk"]["velocity"]) == {n for n, _ in model.named_parameters()}
    train(model, opt, data[3:])
    resumed = SmallCNN()
    resumed.load_state_dict(saved_model)
    opt2 = corrected(resumed, ratio=0.05, downlink_ratio=0.02, min_size=256)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, data[3:])
    for (name, a), b in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name
    # The wrapped step ran without momentum and weight decay, which are restored after.
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["weight_decay"] == 1e-3


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("make, message", [
    (lambda p: torch.optim.Adam(p, lr=0.01), "needs torch.optim.SGD"),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True), "nesterov=True"),
])
def test_momentum_correction_refuses_optimizers_it_cannot_take_over(make, message):
    model = Flat()
    with pytest.raises(ValueError, match=message):
        topk_optimizer(model, hvd.Compression.topk(0.01, momentum_correction=True),
                       make(model.parameters()))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("selection", ["layerwise", "global"])
def test_momentum_correction_keeps_the_velocities_in_one_buffer_that_the_exchange_reads(
        selection):
    """The compressed tensors' velocities are views of one flat buffer, which global
    selection reads as its concatenation (no copy); training equals, bitwise, the same
    run with one velocity tensor per parameter."""
    data = batches(hvd.rank(), 4, seed=7)
    runs = []
    for one_buffer in (True, False):
        model = initial_model()
        opt = corrected(model, ratio=0.05, downlink_ratio=0.02, min_size=256,
                        selection=selection)
        if not one_buffer:
            opt._hvdx_flatten_velocity = lambda compressed: ()
        train(model, opt, data)
        runs.append((model, opt))
    (model, opt), (reference, separate) = runs
    names, buffer = opt._hvdx_flat_velocity
    assert len(names) >= 2 and separate._hvdx_flat_velocity is None
    storage = buffer.untyped_storage().data_ptr()
    assert all(opt._hvdx_velocity[n].untyped_storage().data_ptr() == storage for n in names)
    if selection == "global":
        assert opt._hvdx_sync.concatenation.buffer is None
        assert separate._hvdx_sync.concatenation.buffer is not None
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(a, b), name


# --- presets: DGC's momentum correction only where it applies ----------------------------

PRESET_NOTE = "runs without DGC's momentum correction"


def preset_notes(capfd):
    return [line for line in capfd.readouterr().err.splitlines() if PRESET_NOTE in line]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("preset", ["fast", "safe"])
def test_a_preset_with_adam_is_horovods_average_then_adam_at_ratio_one_and_says_so_once(
        preset, capfd):
    """Adam has no SGD momentum to take over: the preset runs without momentum
    correction. At ratio 1 (and with its small tensors averaged in the TopK step) that is
    Horovod's dense average followed by plain torch's Adam step."""
    from hvdx.strategies.topk import torch_preset_fit as preset_fit

    preset_fit._SAID.clear()  # earlier tests of this process may have said it already
    capfd.readouterr()
    model, reference = initial_model(), initial_model()
    spec = hvd.Compression.topk(preset=preset, ratio=1.0, downlink_ratio=1.0)
    opt = topk_optimizer(model, spec, torch.optim.Adam(model.parameters(), lr=0.01))
    other = Flat()  # a second optimizer of the same kind: nothing more is said
    topk_optimizer(other, spec, torch.optim.Adam(other.parameters(), lr=0.01))
    assert not opt._hvdx_sync.compression.momentum_correction
    adam = torch.optim.Adam(reference.parameters(), lr=0.01)
    for step, (x, y) in enumerate(batches(hvd.rank(), 3, seed=8)):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        adam.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        for name, p in reference.named_parameters():
            p.grad = horovod.torch.allreduce(p.grad, op=hvd.Average,
                                             name=f"check.adam.{step}.{name}")
        adam.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    notes = preset_notes(capfd)
    assert len(notes) == (1 if hvd.rank() == 0 else 0), notes
    if notes:
        assert notes[0].startswith(f"[hvdx] topk(preset={preset!r}) ")
        assert "Adam is not torch.optim.SGD" in notes[0]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("make, corrected", [
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), True),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=1e-4), True),
    (lambda p: torch.optim.SGD(p, lr=0.01), False),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True), False),
    (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, dampening=0.5), False),
    (lambda p: torch.optim.AdamW(p, lr=0.01), False),
    (lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.9), False),
], ids=["sgd-momentum", "sgd-momentum-decay", "sgd", "nesterov", "dampening", "adamw",
        "rmsprop"])
@pytest.mark.parametrize("preset", ["fast", "safe"])
def test_presets_use_momentum_correction_only_for_sgd_with_plain_momentum(
        preset, make, corrected, capfd):
    from hvdx.strategies.topk import torch_preset_fit as preset_fit

    preset_fit._SAID.clear()
    capfd.readouterr()
    model = initial_model()
    opt = topk_optimizer(model, hvd.Compression.topk(preset=preset),
                         make(model.parameters()))
    train(model, opt, batches(hvd.rank(), 2, seed=9))
    spec = opt._hvdx_sync.compression
    assert spec.momentum_correction == corrected
    assert spec.momentum_masking  # both presets mask; without correction it has no object
    # Adam's family sends 20% both ways; every other optimizer the preset's 1% up.
    assert spec.ratio == (0.2 if "betas" in opt.param_groups[0] else 0.01)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert len(preset_notes(capfd)) == (0 if corrected or hvd.rank() else 1)


@pytest.mark.mpi(min_size=1)
def test_a_preset_with_momentum_correction_false_is_sgd_with_momentum_at_ratio_one():
    """The caller's momentum_correction=False takes the preset's masking setting with it
    (no refusal), and SGD keeps its own momentum: Horovod's SGD at ratio 1."""
    model, reference = initial_model(), initial_model()
    spec = hvd.Compression.topk(preset="fast", momentum_correction=False, ratio=1.0,
                                downlink_ratio=1.0)
    assert_same_training(model, corrected_with(model, spec),
                         reference, horovod_sgd(reference, 0.9, 1e-3))


@pytest.mark.mpi(min_size=1)
def test_an_explicit_momentum_correction_with_a_preset_still_refuses_adam():
    model = Flat()
    with pytest.raises(ValueError, match=r"momentum_correction=True needs torch\.optim\.SGD "
                                         r"\(with momentum\), got Adam"):
        topk_optimizer(model, hvd.Compression.topk(preset="fast", momentum_correction=True),
                       torch.optim.Adam(model.parameters(), lr=0.01))


# --- Horovod's checks and warnings ------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_step_after_synchronize_without_skip_synchronize_warns_as_horovod():
    """Horovod's warning, word for word (taken from Horovod's own optimizer here); the
    step then does not exchange again."""
    import warnings

    def synchronize_then_step(make):
        model = nn.Linear(1, 1)
        opt = make(torch.optim.SGD(model.parameters(), lr=0.1),
                   named_parameters=model.named_parameters())
        F.mse_loss(model(torch.zeros(1, 1)), torch.ones(1, 1)).backward()
        opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        return opt, [str(w.message) for w in caught]

    _, theirs = synchronize_then_step(horovod.torch.DistributedOptimizer)
    ours, warned = synchronize_then_step(
        lambda opt, **kw: hvd.DistributedOptimizer(
            opt, compression=hvd.Compression.topk(1.0, 1.0, min_size=0), **kw))
    assert len(theirs) == 1 and warned == theirs
    assert ours._hvdx_sync.stats.steps == 1  # one exchange, not two
