"""The checks of ``scripts/device_check``, as each rank runs them.

``scripts/device_check.py`` (the driver) names the checks, launches this file and reads
what it records; this file holds what each check does. A launch:

    mpirun -n 2 python scripts/device_check_job.py --launch main --device cuda \\
        --checks "topk gathered,stanza" --progress DIR/main-1 --tmp DIR

1. ``--launch main``: ``hvd.init(process_sets="dynamic")`` (DS-Sync registers
   process sets; every other strategy runs in that mode too), then each check in the
   order given; ``--launch host``: one process without MPI, for checks that launch
   their own MPI job (``hvdx bench --overlap``);
2. before and after each check, every rank appends one JSON line to
   ``<progress>.rank<R>.jsonl``: ``start``, then ``pass``, ``fail`` or ``skip`` with
   the seconds, the device and a note. The driver reads these lines while the job runs,
   so that a check that hangs, or a rank that dies, is known by name;
3. a check verifies what it promises with :meth:`Context.expect`; at its end the ranks
   agree on every rank's failures (one small allgather), so that a wrong result fails
   on every rank together and the next check runs;
4. an exception inside a check is recorded, then raised: hvdx's abort-on-error ends
   the whole job (a rank stuck in a collective could not go on), and the driver
   launches the checks not yet decided again.

Device: each rank takes ``cuda:<local rank modulo the GPUs>`` (two ranks share one GPU
on a one-GPU machine), or the CPU with ``--device cpu``. Every model is built on the
CPU from a seed and moved there, so that the references computed on the CPU start from
the same weights. The cross-rank comparisons go through mpi4py on host copies, never
through Horovod: a Horovod built without GPU support fails only the checks whose own
path runs Horovod's ops on device tensors.

Only the standard library, numpy and torch are imported at module level: the driver
imports this file to list the checks, without starting MPI.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import pathlib
import sys
import time
import traceback
from typing import Callable, Dict, List, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

#: ``name -> Check``, in the order the checks run; filled by :func:`check`.
BODIES: Dict[str, "Check"] = {}


class Check(NamedTuple):
    launch: str          # "main" (the 2-rank job) or "host" (one process, no MPI)
    verifies: str        # what a pass means, for ``--list`` and the documentation
    function: Callable


def check(name: str, verifies: str, launch: str = "main"):
    """Register the decorated function as the check ``name``, run in ``launch``."""
    def register(function: Callable) -> Callable:
        BODIES[name] = Check(launch, verifies, function)
        return function
    return register


class Skip(Exception):
    """Raised by a check that cannot run here (its data is missing), on every rank."""


class Context:
    """What a check gets: the job, its device, and the verdicts it collects."""

    def __init__(self, hvd, comm, device: torch.device, tmp: str):
        self.hvd, self.comm, self.device, self.tmp = hvd, comm, device, tmp
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        self.failures: List[str] = []
        self.notes: List[str] = []

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def expect(self, condition, message: str) -> bool:
        """Record ``message`` as a failure of this rank's unless ``condition`` holds."""
        if not condition:
            self.failures.append(message)
        return bool(condition)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def everyone(self, value):
        """Every rank's ``value``, in rank order (mpi4py, on host copies)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu").numpy().copy()
        return self.comm.allgather(value) if self.comm is not None else [value]

    def same_everywhere(self, tensors, what: str) -> bool:
        """Expect ``tensors`` bitwise equal on every rank."""
        flat = np.concatenate([t.detach().to("cpu", torch.float64).reshape(-1).numpy()
                               for t in tensors])
        gathered = self.everyone(flat)
        return self.expect(all(np.array_equal(gathered[0], g) for g in gathered),
                           f"{what} differ between ranks")

    def on_device(self, named, what: str) -> bool:
        """Expect every tensor of ``named`` (``(name, tensor)`` pairs) on the device."""
        away = [f"{n} on {t.device}" for n, t in named
                if isinstance(t, torch.Tensor) and t.device != self.device]
        return self.expect(not away, f"{what} left the device: {', '.join(away[:3])}")

    def shared_path(self, name: str) -> str:
        return os.path.join(self.tmp, name)


def job_device(kind: str, hvd) -> torch.device:
    """This rank's device: the CPU, or the GPU of its local rank (in turn)."""
    if kind == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


# --- models and data -----------------------------------------------------------------

D = 3000  # entries of the TopK checks' flat parameter


def synthetic_grads(size: int, step: int, d: int = D, seed: int = 0) -> List[np.ndarray]:
    """Every rank's gradient at ``step`` (every rank computes all of them); magnitudes
    over four orders, as real gradients spread, so that TopK's choice is no coin toss."""
    scale = np.exp(np.random.default_rng([seed]).uniform(-3, 1, d))
    return [(np.random.default_rng([seed, step, r]).standard_normal(d) * scale)
            .astype(np.float32) for r in range(size)]


class SmallCNN(nn.Module):
    """Conv and FC layers on 8x8 inputs: one tensor above TopK's ``min_size`` (fc1's
    weight), the others below it."""

    def __init__(self, hidden=128):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def fixed_batch(rank: int, batch: int = 16, seed: int = 0):
    """This rank's batch of 8x8 inputs and labels (other on every rank, the same on
    every run), on the CPU."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g)


class Point(nn.Module):
    """Two parameters, one per host buffer family (float64 and float32), and a loss
    whose gradient is known: ``f_r(x) = 0.5 ||x - c_r||^2``."""

    def __init__(self, x64, x32):
        super().__init__()
        self.x64 = nn.Parameter(torch.tensor(x64, dtype=torch.float64))
        self.x32 = nn.Parameter(torch.tensor(x32, dtype=torch.float32))

    def forward(self, c64, c32):
        return 0.5 * ((self.x64 - c64) ** 2).sum() + 0.5 * ((self.x32 - c32) ** 2).sum()


def point_start(rank: int, dim: int = 6):
    g = np.random.default_rng(500 + rank)
    return g.normal(size=dim), g.normal(size=dim).astype(np.float32)


def point_centre(rank: int, dim: int = 6):
    g = np.random.default_rng(50 + rank)
    return g.normal(size=dim), g.normal(size=dim).astype(np.float32)


POINT_LR = 0.3


def train_point(c: Context, sync, steps: int):
    """Train :class:`Point` on the device under ``sync``; return the model and the
    optimizer after ``steps`` steps."""
    model = Point(*point_start(c.rank)).to(c.device)
    opt = c.hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=POINT_LR),
                                     named_parameters=model.named_parameters(), sync=sync)
    targets = [torch.tensor(t).to(c.device) for t in point_centre(c.rank)]
    for _ in range(steps):
        opt.zero_grad()
        model(*targets).backward()
        opt.step()
    return model, opt


def expect_point(c: Context, model, opt, matrix, steps: int, order: str, what: str):
    """Expect every rank's :class:`Point` after ``steps`` steps to be what the mixing
    matrix ``matrix(step)`` gives (adapt-then-combine ``x <- W (x - lr (x - c))``,
    combine-then-adapt ``x <- W x - lr (x - c)``), and its tensors on the device."""
    mine = [t.detach().to("cpu").numpy().copy() for t in (model.x64, model.x32)]
    got = [np.stack([r[k] for r in c.everyone(mine)]) for k in (0, 1)]
    for k, (family, atol) in enumerate((("float64", 1e-12), ("float32", 1e-5))):
        x = np.stack([point_start(r)[k] for r in range(c.size)]).astype(np.float64)
        centre = np.stack([point_centre(r)[k] for r in range(c.size)]).astype(np.float64)
        for t in range(steps):
            w = matrix(t)
            x = w @ (x - POINT_LR * (x - centre)) if order == "atc" else \
                w @ x - POINT_LR * (x - centre)
        error = float(np.abs(got[k] - x).max())
        c.expect(error <= atol, f"{what}: the {family} parameter is {error:.2e} from the "
                                f"explicit mixing matrices (allowed {atol:.0e})")
    c.on_device(list(model.named_parameters()) + momenta(opt), what)


def momenta(opt) -> list:
    """The optimizer's per-parameter tensors, hvdx's TopK velocities and SWA means, as
    ``(name, tensor)`` pairs."""
    named = [(f"state.{i}.{k}", v) for i, s in enumerate(opt.state.values())
             for k, v in s.items()]
    named += [(f"velocity.{n}", v) for n, v in getattr(opt, "_hvdx_velocity", {}).items()]
    named += [(f"swa.{i}", v) for i, v in enumerate(getattr(opt, "_hvdx_swa", None) or [])]
    return named


def average_matrix(size: int):
    return lambda step: np.full((size, size), 1.0 / size)


# --- TopK ----------------------------------------------------------------------------

def topk_against_the_reference(c: Context, mode: str) -> None:
    """3 steps of TopK 0.02 up, 0.01 down on a flat device parameter (lr 0: the update
    is read from ``p.grad``): each update bitwise the numpy reference's."""
    from hvdx.strategies.topk.core_bidirectional import TopKConfig, simulate_step
    from hvdx.strategies.topk.core_error_feedback import ResidualMemory

    ratio, downlink = 0.02, 0.01
    w = nn.Parameter(torch.zeros(D, device=c.device))
    opt = c.hvd.DistributedOptimizer(
        torch.optim.SGD([w], lr=0.0), named_parameters=[("w", w)],
        compression=c.hvd.Compression.topk(ratio, downlink, mode=mode, min_size=0))
    config = TopKConfig(ratio, downlink)
    workers = [ResidualMemory(["w"]) for _ in range(c.size)]
    servers = [ResidualMemory(["w"]) for _ in range(c.size)]
    for step in range(3):
        grads = synthetic_grads(c.size, step)
        w.grad = torch.from_numpy(grads[c.rank].copy()).to(c.device)
        opt.step()
        ref = simulate_step(grads, workers, servers, config, mode, step=step, name="w")
        c.expect(w.grad.device == c.device and w.grad.dtype == torch.float32,
                 f"step {step}: the update is {w.grad.dtype} on {w.grad.device}")
        c.expect(np.array_equal(w.grad.to("cpu").numpy(), ref.u),
                 f"step {step}: the update differs from the numpy reference")
        c.expect(np.array_equal(opt._hvdx_worker.get("w"), workers[c.rank].get("w")),
                 f"step {step}: the worker residual differs from the reference")
    c.same_everywhere([w.grad], "the updates")
    c.note(f"{mode}: 3 steps bitwise the numpy reference")


@check("topk gathered", "each update bitwise the numpy reference's, worker residuals "
       "too, on the device, the same on every rank")
def _topk_gathered(c: Context) -> None:
    topk_against_the_reference(c, "gathered")


@check("topk sharded", "each update bitwise the numpy reference's, worker residuals "
       "too, on the device, the same on every rank")
def _topk_sharded(c: Context) -> None:
    topk_against_the_reference(c, "sharded")


@check("topk momentum correction",
       "ratio 1: (momentum) SGD on the average with and without masking; ratio 0.05: "
       "the same parameters on every rank, velocities kept on the device")
def _topk_momentum_correction(c: Context) -> None:
    """DGC's momentum correction with the velocities on the device.

    1. ratio 1 without masking is SGD with momentum and weight decay on the average
       gradient, with masking plain SGD on it (the whole velocity is sent and cleared);
    2. ratio 0.05 both ways: the same parameters on every rank, the velocities (one flat
       buffer) on the device and not all zero (what was not sent waits there).
    """
    for masking in (False, True):
        w = nn.Parameter(torch.zeros(D, device=c.device))
        opt = c.hvd.DistributedOptimizer(
            torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=1e-3),
            named_parameters=[("w", w)],
            compression=c.hvd.Compression.topk(1.0, min_size=0, momentum_correction=True,
                                               momentum_masking=masking))
        ref = nn.Parameter(torch.zeros(D))
        ref_opt = torch.optim.SGD([ref], lr=0.1, momentum=0.0 if masking else 0.9,
                                  weight_decay=1e-3)
        for step in range(4):
            grads = synthetic_grads(c.size, step, seed=1)
            w.grad = torch.from_numpy(grads[c.rank].copy()).to(c.device)
            opt.step()
            ref.grad = torch.from_numpy(np.mean(grads, axis=0, dtype=np.float32))
            ref_opt.step()
        close = np.allclose(w.detach().to("cpu").numpy(), ref.detach().numpy(),
                            rtol=1e-5, atol=1e-6)
        c.expect(close, f"ratio 1, masking={masking}: the parameters are not "
                        f"{'plain SGD' if masking else 'momentum SGD'} on the average")
        c.on_device(momenta(opt), f"ratio 1, masking={masking}")

    w = nn.Parameter(torch.zeros(D, device=c.device))
    opt = c.hvd.DistributedOptimizer(
        torch.optim.SGD([w], lr=0.1, momentum=0.9), named_parameters=[("w", w)],
        compression=c.hvd.Compression.topk(0.05, 0.05, min_size=0, momentum_correction=True))
    for step in range(4):
        w.grad = torch.from_numpy(synthetic_grads(c.size, step, seed=2)[c.rank].copy()) \
            .to(c.device)
        opt.step()
        c.same_everywhere([w], f"step {step}: the parameters")
    velocity = opt._hvdx_velocity.get("w")
    c.expect(velocity is not None and bool(velocity.abs().sum() > 0),
             "ratio 0.05: no velocity kept")
    c.on_device(momenta(opt), "ratio 0.05")
    c.note("ratio 1 = (momentum) SGD on the average; ratio 0.05 identical on every rank")


def train_small_cnn(c: Context, compression, steps: int, what: str) -> None:
    """Train :class:`SmallCNN` (the same initial weights on every rank, each rank its own
    fixed batch) under ``compression``: the parameters identical on every rank after
    every step, the loss down, gradients and state on the device."""
    torch.manual_seed(0)
    model = SmallCNN().to(c.device)
    opt = c.hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), compression=compression)
    x, y = (t.to(c.device) for t in fixed_batch(c.rank))
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        c.same_everywhere(model.parameters(), f"{what}, step {step}: the parameters")
    c.expect(np.mean(losses[-3:]) < losses[0],
             f"{what}: the loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})")
    c.on_device(list(model.named_parameters()) +
                [(f"{n}.grad", p.grad) for n, p in model.named_parameters()] + momenta(opt),
                what)
    stats = getattr(opt, "hvdx_stats", None)
    c.expect(stats is not None and (stats.total_sent > 0 or c.size == 1),
             f"{what}: hvdx counted no bytes sent")
    c.note(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {steps} steps")


@check("topk preset fast", "the same parameters on every rank after every step, the "
       "loss falls, gradients and velocities on the device, bytes counted")
def _topk_fast(c: Context) -> None:
    train_small_cnn(c, c.hvd.Compression.topk(preset="fast"), 12, "preset fast")


@check("topk preset safe", "the same parameters on every rank after every step, the "
       "loss falls, gradients and velocities on the device, bytes counted")
def _topk_safe(c: Context) -> None:
    train_small_cnn(c, c.hvd.Compression.topk(preset="safe"), 12, "preset safe")


@check("topk small tensors via Horovod",
       "topk(0.05) with its small tensors in Horovod's allreduce: as the presets' row")
def _topk_small_tensors(c: Context) -> None:
    # The default small_tensors: the biases and small layers go through Horovod's own
    # allreduce, so this row needs a Horovod that takes tensors on the device.
    train_small_cnn(c, c.hvd.Compression.topk(0.05), 6, "topk(0.05)")


# --- the mixers ----------------------------------------------------------------------

@check("dssync", "each step the group average of the local steps (float64 and float32 "
       "parameters), state on the device")
def _dssync(c: Context) -> None:
    """DS-Sync at 2 ranks (one group of both): Horovod's grouped allreduce of the
    device tensors; every step is the average of the ranks' local steps."""
    import hvdx

    steps = 4
    model, opt = train_point(c, hvdx.DSSync("shuffle", group_size=c.size, seed=1), steps)
    expect_point(c, model, opt, average_matrix(c.size), steps, "atc", "DS-Sync")
    c.note(f"{steps} steps = group averages (float64 and float32)")


@check("decentralized atc", "parameters as the explicit mixing matrices give (both host "
       "buffer families); BatchNorm buffers mixed; all on the device")
def _decentralized_atc(c: Context) -> None:
    """Adapt-then-combine over the one-peer exponential graph: the fused host buffers
    (float64 and float32 families) against explicit matrices; BatchNorm's buffers mixed
    along (``named_buffers``)."""
    import hvdx

    steps = 5
    model, opt = train_point(c, hvdx.Decentralized("one-peer-exp"), steps)
    expect_point(c, model, opt, average_matrix(c.size), steps, "atc", "one-peer-exp")

    torch.manual_seed(c.rank)  # other weights on every rank: only the mixing aligns them
    net = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(),
                        nn.Linear(4, 2)).to(c.device)
    opt = c.hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                     named_parameters=net.named_parameters(),
                                     sync=hvdx.Decentralized("one-peer-exp"),
                                     named_buffers=net.named_buffers())
    for step in range(3):
        g = torch.Generator().manual_seed(1000 * step + c.rank)
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        ((net(x.to(c.device)) - y.to(c.device)) ** 2).mean().backward()
        opt.step()
    floating = [b for b in net.buffers() if b.is_floating_point()]
    # At 2 ranks one peer is everyone: one mix averages exactly.
    c.same_everywhere(list(net.parameters()) + floating, "parameters and BatchNorm buffers")
    c.on_device(list(net.named_parameters()) + list(net.named_buffers()), "BatchNorm model")
    c.note(f"{steps} steps = explicit matrices; BatchNorm buffers mixed")


@check("decentralized cta", "parameters as the explicit mixing matrices give, the "
       "exchange completing during the next pass; on the device")
def _decentralized_cta(c: Context) -> None:
    """Combine-then-adapt: the exchange of ``x_t`` runs during the next forward and
    backward pass and its change is added on the device."""
    import hvdx

    steps = 5
    model, opt = train_point(c, hvdx.Decentralized("one-peer-exp",
                                                   order="combine_then_adapt"), steps)
    opt.synchronize()  # the last exchange is still in flight
    expect_point(c, model, opt, average_matrix(c.size), steps, "cta", "combine-then-adapt")
    c.note(f"{steps} steps = explicit matrices (float64 and float32)")


@check("registered mixer", "a hvdx.register_mixer mixer's steps equal its matrix's; "
       "results written back to the device")
def _registered_mixer(c: Context) -> None:
    """A mixer of the user's own (``hvdx.register_mixer``): its arrays are host copies
    of the device tensors, and its result is written back to the device."""
    import hvdx

    class Gossip(hvdx.Mixer):
        def __init__(self, a=0.25):
            self.a = a

        def settings(self):
            return {"a": self.a}

        def matrix(self, step, size):
            return (1 - self.a) * np.eye(size) + self.a * np.roll(np.eye(size), 1, axis=1)

    hvdx.register_mixer("device_check_gossip", Gossip)
    steps = 4
    model, opt = train_point(c, hvdx.mixer("device_check_gossip", a=0.25), steps)
    expect_point(c, model, opt, lambda t: Gossip(0.25).matrix(t, c.size), steps, "atc",
                 "registered mixer")
    c.note(f"{steps} steps = its matrix")


# --- Stanza --------------------------------------------------------------------------

STANZA_LR = 0.5


def stanza_model(seed: int):
    torch.manual_seed(seed)
    features = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh())
    return features.double(), nn.Linear(6, 3).double()


def stanza_batch(step: int):
    """Step ``step``'s global batch (9 or 11 samples, so that shares are uneven)."""
    g = torch.Generator().manual_seed(100 + step)
    size = 9 + 2 * (step % 2)
    return (torch.randn(size, 5, generator=g, dtype=torch.float64),
            torch.randint(0, 3, (size,), generator=g))


def stanza_share(trainer, step: int, device):
    """This conv worker's part of the global batch, on the device (conv worker i of S
    takes samples [i B // S, (i + 1) B // S)); nothing on an FC worker."""
    if trainer.role != "conv":
        return None, None
    x, y = stanza_batch(step)
    conv = list(trainer.roles.conv_ranks)
    i, s, b = conv.index(trainer.rank), len(conv), len(y)
    return x[b * i // s:b * (i + 1) // s].to(device), y[b * i // s:b * (i + 1) // s].to(device)


def stanza_trainer(c: Context, seed: int, micro_batches: int = 1):
    features, head = stanza_model(seed)
    features, head = features.to(c.device), head.to(c.device)
    opt = torch.optim.SGD(itertools.chain(features.parameters(), head.parameters()),
                          lr=STANZA_LR, momentum=0.9)
    return c.hvd.Stanza(features, head, opt, fc_workers=1, micro_batches=micro_batches)


def stanza_reference(steps: int):
    """Single-process SGD on the global batches from rank 0's model, on the CPU."""
    features, head = stanza_model(0)
    model = nn.Sequential(features, head)
    opt = torch.optim.SGD(model.parameters(), lr=STANZA_LR, momentum=0.9)
    for step in range(steps):
        x, y = stanza_batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return features, head


def close_modules(a: nn.Module, b: nn.Module) -> bool:
    return all(np.allclose(x.detach().to("cpu").numpy(), y.detach().to("cpu").numpy(),
                           rtol=1e-5, atol=1e-10)
               for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@check("stanza", "each role's part and full_model equal single-process SGD on the global "
       "batch, whole and in micro-batches; parts on the device")
def _stanza(c: Context) -> None:
    """Stanza with its parts on the device: activations go to the host to be sent,
    their gradients come back to the device. Every step, whole or in 2 micro-batches,
    trains what single-process SGD on the global batch trains; ``full_model`` too."""
    steps = 3
    features, head = stanza_reference(steps)
    for micro_batches in (1, 2):
        trainer = stanza_trainer(c, seed=c.rank, micro_batches=micro_batches)
        losses = [trainer.step(*stanza_share(trainer, step, c.device)) for step in range(steps)]
        mine, ref = (trainer.features, features) if trainer.role == "conv" else \
            (trainer.head, head)
        c.expect(close_modules(mine, ref),
                 f"micro_batches={micro_batches}: the {trainer.role} part differs from "
                 "single-process SGD on the global batch")
        c.expect(all(math.isfinite(v) for v in losses), f"losses {losses}")
        c.on_device(list(mine.named_parameters()) + momenta(trainer.optimizer),
                    f"micro_batches={micro_batches}")
        whole = trainer.full_model(rank=0)
        if c.rank == 0:
            c.expect(close_modules(whole, nn.Sequential(features, head)),
                     "full_model differs from single-process SGD's model")
    c.note(f"{steps} steps = single-process SGD, whole and in 2 micro-batches")


# --- checkpoints ---------------------------------------------------------------------

CKPT_STEPS, CKPT_STOP = 4, 2


def resume_is_bitwise(c: Context, build: Callable, train: Callable, what: str,
                      modules: Callable) -> None:
    """Train ``CKPT_STEPS`` steps straight; then ``CKPT_STOP`` steps, a checkpoint, fresh
    objects on other weights, the load and the rest: every tensor bitwise the straight
    run's, and every tensor of the resumed objects on the device.

    ``build(seed) -> state``; ``train(state, steps)``; ``modules(state) -> (module,
    optimizer)`` compared and placed.
    """
    path = c.shared_path(f"{what}.ckpt")
    straight = build(0)
    train(straight, range(CKPT_STEPS))
    first = build(0)
    train(first, range(CKPT_STOP))
    c.hvd.save_checkpoint(path, *first["saved"], step=CKPT_STOP)
    resumed = build(10)
    extra = c.hvd.load_checkpoint(path, *resumed["saved"])
    c.expect(extra == {"step": CKPT_STOP}, f"{what}: load_checkpoint gave {extra}")
    module, opt = modules(resumed)
    c.on_device(list(module.state_dict().items()) + momenta(opt), f"{what}, loaded")
    train(resumed, range(CKPT_STOP, CKPT_STEPS))
    differ = [n for (n, a), b in zip(modules(straight)[0].state_dict().items(),
                                     module.state_dict().values()) if not torch.equal(a, b)]
    c.expect(not differ, f"{what}: {', '.join(differ[:3])} differ from the uninterrupted run")


def optimizer_run(c: Context, options: Callable[[], dict]):
    """``build`` and ``train`` of :func:`resume_is_bitwise` for hvdx's optimizer."""
    def build(seed):
        torch.manual_seed(seed + c.rank)
        model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Tanh(),
                              nn.Linear(4, 2)).to(c.device)
        kwargs = options()
        if "sync" in kwargs:
            kwargs["named_buffers"] = model.named_buffers()
        opt = c.hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=model.named_parameters(), **kwargs)
        return {"model": model, "opt": opt, "saved": (model, opt)}

    def train(state, steps):
        model, opt = state["model"], state["opt"]
        for step in steps:
            g = torch.Generator().manual_seed(1000 * step + c.rank)
            x, y = torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)
            opt.zero_grad()
            ((model(x.to(c.device)) - y.to(c.device)) ** 2).mean().backward()
            opt.step()
        if hasattr(opt, "hvdx_graph"):
            opt.synchronize()  # decentralized SGD's exchange in flight

    return build, train, lambda state: (state["model"], state["opt"])


@check("checkpoint topk", "save, fresh objects, load, go on: every tensor bitwise the "
       "uninterrupted run's; loaded state on the device")
def _checkpoint_topk(c: Context) -> None:
    build, train, modules = optimizer_run(c, lambda: {"compression": c.hvd.Compression.topk(
        0.1, 0.05, min_size=0, momentum_correction=True)})
    resume_is_bitwise(c, build, train, "topk", modules)
    c.note(f"resumed at step {CKPT_STOP} of {CKPT_STEPS}: bitwise (residuals, velocities)")


@check("checkpoint dssync", "save, fresh objects, load, go on: every tensor bitwise the "
       "uninterrupted run's; loaded state on the device")
def _checkpoint_dssync(c: Context) -> None:
    import hvdx

    build, train, modules = optimizer_run(c, lambda: {"sync": hvdx.DSSync(
        "shuffle", group_size=c.size, seed=4, swa_start=1)})
    resume_is_bitwise(c, build, train, "dssync", modules)
    c.note(f"resumed at step {CKPT_STOP} of {CKPT_STEPS}: bitwise (with SWA)")


@check("checkpoint decentralized", "save, fresh objects, load, go on: every tensor bitwise the "
       "uninterrupted run's; loaded state on the device")
def _checkpoint_decentralized(c: Context) -> None:
    import hvdx

    for order in ("adapt_then_combine", "combine_then_adapt"):
        build, train, modules = optimizer_run(c, lambda: {"sync": hvdx.Decentralized(
            "one-peer-exp", order=order)})
        resume_is_bitwise(c, build, train, f"decentralized-{order}", modules)
    c.note(f"both orders resumed at step {CKPT_STOP} of {CKPT_STEPS}: bitwise")


@check("checkpoint stanza", "save, fresh objects, load, go on: every tensor bitwise the "
       "uninterrupted run's; loaded state on the device")
def _checkpoint_stanza(c: Context) -> None:
    def build(seed):
        trainer = stanza_trainer(c, seed=seed + c.rank)
        return {"trainer": trainer, "saved": (trainer,)}

    def train(state, steps):
        trainer = state["trainer"]
        for step in steps:
            trainer.step(*stanza_share(trainer, step, c.device))

    def modules(state):
        t = state["trainer"]
        return (t.features if t.role == "conv" else t.head), t.optimizer

    resume_is_bitwise(c, build, train, "stanza", modules)
    c.note(f"resumed at step {CKPT_STOP} of {CKPT_STEPS}: bitwise")


# --- the benchmark's workloads -------------------------------------------------------

def workload_step(c: Context, name: str) -> None:
    """The workload's model built on the device, one forward and backward pass on a
    batch of its real data, one step of its optimizer: every parameter has a finite
    gradient on the device, and the loss on that batch falls."""
    from hvdx.bench.workloads import WORKLOADS

    workload = WORKLOADS[name]
    try:
        workload.check_data()
    except Exception as error:  # noqa: BLE001 - the reason is the note
        raise Skip(f"its data is not on this machine: {error}") from None
    data = workload.data()
    torch.manual_seed(0)
    model = workload.make_model().to(c.device)
    opt = workload.make_optimizer(model.parameters(), c.size)
    lo = c.rank * workload.batch_size
    x, y = (torch.from_numpy(a[lo:lo + workload.batch_size]).to(c.device)
            for a in (data.x_train, data.y_train))
    output = model(x)
    loss = workload.loss(output, y)
    loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.grad is None or not bool(torch.isfinite(p.grad).all())]
    c.expect(not missing, f"no finite gradient for {', '.join(missing[:3])}")
    c.on_device([("output", output)] + [(f"{n}.grad", p.grad) for n, p in
                                        model.named_parameters() if p.grad is not None],
                name)
    opt.step()
    with torch.no_grad():
        after = workload.loss(model(x), y).item()
    c.expect(after < loss.item(), f"the loss did not fall ({loss.item():.3f} -> {after:.3f})")
    count = sum(p.numel() for p in model.parameters())
    c.note(f"{count / 1e6:.2f} M parameters; loss {loss.item():.3f} -> {after:.3f}")


@check("workload lm", "built on the device: finite gradients there, the loss falls after "
       "one step")
def _workload_lm(c: Context) -> None:
    workload_step(c, "lm")


@check("workload resnet", "built on the device: finite gradients there, the loss falls "
       "after one step")
def _workload_resnet(c: Context) -> None:
    workload_step(c, "resnet")


# --- the examples --------------------------------------------------------------------

def load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rank0_output(c: Context, run: Callable[[], None]) -> str:
    """Run ``run`` on every rank; what rank 0 printed (empty elsewhere)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        run()
    return buffer.getvalue() if c.rank == 0 else ""


def digits_example(c: Context, strategy: str) -> None:
    """examples/torch_digits.py with ``--device``: one epoch of 3 steps and a checkpoint,
    then a second run that resumes after epoch 1 and trains epoch 2 only (as the test
    suite runs it on the CPU), on this rank's device."""
    main = load_example("torch_digits").main
    path = c.shared_path(f"digits-{strategy}.ckpt")
    argv = ["--strategy", strategy, "--steps-per-epoch", "3", "--checkpoint", path,
            "--device", str(c.device)]
    first = rank0_output(c, lambda: main(argv + ["--epochs", "1"]))
    second = rank0_output(c, lambda: main(argv + ["--epochs", "2"]))
    if c.rank == 0:
        import re

        accuracy = re.findall(r"device (\S+)  final test accuracy (\S+)", first + second)
        c.expect(len(accuracy) == 2 and all(d == str(c.device) and 0 <= float(a) <= 1
                                            for d, a in accuracy),
                 f"no final accuracy on {c.device}: {(first + second)[-300:]!r}")
        c.expect("resumed" not in first and os.path.getsize(path) > 0,
                 f"the first run: {first[-300:]!r}")
        c.expect(f"resumed from {path} after epoch 1" in second and "epoch 1/2" not in
                 second and "epoch 2/2" in second, f"the resumed run: {second[-300:]!r}")
        if accuracy:
            c.note(f"trained, checkpointed, resumed; accuracy {accuracy[-1][1]}")


EXAMPLE_VERIFIES = ("trains on the device, checkpoints, resumes after epoch 1 and trains "
                    "epoch 2 only; prints its accuracy")


@check("example torch_digits none", EXAMPLE_VERIFIES)
def _example_none(c: Context) -> None:
    digits_example(c, "none")


@check("example torch_digits topk", EXAMPLE_VERIFIES)
def _example_topk(c: Context) -> None:
    digits_example(c, "topk")


@check("example torch_digits dssync", EXAMPLE_VERIFIES)
def _example_dssync(c: Context) -> None:
    digits_example(c, "dssync")


@check("example torch_digits decentralized", EXAMPLE_VERIFIES)
def _example_decentralized(c: Context) -> None:
    digits_example(c, "decentralized")


@check("example torch_digits stanza", EXAMPLE_VERIFIES)
def _example_stanza(c: Context) -> None:
    digits_example(c, "stanza")


@check("example pytorch_synthetic_benchmark",
       "imports switched, HVDX_COMPRESSION=fast: hvdx's TopK sends, model and data on "
       "the device, 2 iterations printed")
def _example_synthetic(c: Context) -> None:
    """Horovod's synthetic benchmark with its import switched to hvdx and
    ``HVDX_COMPRESSION=fast``, as ``hvdx bench --script`` runs it: 2 timed iterations,
    the model and data on the device, hvdx's TopK counting its bytes."""
    from hvdx.bench.script import switch_imports
    from hvdx.environment_variables import COMPRESSION_VARIABLE

    path = EXAMPLES / "pytorch_synthetic_benchmark.py"
    source, _ = switch_imports(path.read_text(), str(path))
    argv = [str(path), "--batch-size", "8", "--num-warmup-batches", "1",
            "--num-batches-per-iter", "1", "--num-iters", "2"] + \
        ([] if c.cuda else ["--no-cuda"])
    names = {"__name__": "__main__", "__file__": str(path)}
    saved_argv, saved = sys.argv, os.environ.get(COMPRESSION_VARIABLE)
    sys.argv, os.environ[COMPRESSION_VARIABLE] = argv, "fast"
    try:
        output = rank0_output(c, lambda: exec(compile(source, str(path), "exec"), names))
    finally:
        sys.argv = saved_argv
        if saved is None:
            os.environ.pop(COMPRESSION_VARIABLE)
        else:
            os.environ[COMPRESSION_VARIABLE] = saved
    stats = getattr(names.get("optimizer"), "hvdx_stats", None)
    c.expect(stats is not None and (stats.total_sent > 0 or c.size == 1),
             "the optimizer is not hvdx's TopK, or it sent nothing")
    c.on_device(list(names["model"].named_parameters()) + [("data", names["data"])],
                "the benchmark")
    if c.rank == 0:
        unit = "GPU" if c.cuda else "CPU"
        c.expect(output.count("Iter #") == 2 and f"img/sec per {unit}" in output,
                 f"not 2 iterations per {unit}: {output[-300:]!r}")
        c.note("HVDX_COMPRESSION=fast; " + (output.strip().splitlines() or ["-"])[-1])


# --- Horovod's timeline and the step log ---------------------------------------------

def short_training(c: Context) -> None:
    """A few steps of TopK's fast preset, decentralized SGD and Stanza on the device,
    and one Horovod allreduce of a host tensor (Horovod's own row in the timeline)."""
    import hvdx

    c.hvd.allreduce(torch.ones(4), name="device_check.timeline")
    for options in ({"compression": c.hvd.Compression.topk(preset="fast")},
                    {"sync": hvdx.Decentralized("one-peer-exp")}):
        torch.manual_seed(0)
        model = SmallCNN().to(c.device)
        opt = c.hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         **options)
        x, y = (t.to(c.device) for t in fixed_batch(c.rank))
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    trainer = stanza_trainer(c, seed=0)
    for step in range(3):
        trainer.step(*stanza_share(trainer, step, c.device))


@check("timeline", "rank 0's file holds Horovod's ops and hvdx's TopK, neighbour and Stanza "
       "events, inside the window")
def _timeline(c: Context) -> None:
    """``hvd.start_timeline`` / ``hvd.stop_timeline`` around a short training on the
    device: rank 0's file holds Horovod's JSON and hvdx's exchanges (TopK's, the
    neighbour exchange's, Stanza's waits), each with its bytes, inside the window."""
    path = c.shared_path("timeline.json")
    began = time.time_ns() // 1000
    c.hvd.start_timeline(path)
    short_training(c)
    c.hvd.stop_timeline()
    ended = time.time_ns() // 1000
    if c.rank != 0:
        return
    with open(path) as f:
        events = json.load(f)
    start = events[0]["args"]["start_time_since_epoch_in_micros"]
    rows = {e["pid"]: e["args"].get("name", "") for e in events
            if e.get("name") == "process_name"}
    ours = [e for e in events if e.get("ph") == "X" and rows[e["pid"]].startswith("hvdx: ")]
    found = {(rows[e["pid"]], e["name"]) for e in ours}
    for row, name in (("hvdx: topk", "HVDX_TOPK_FINITE_CHECK"),
                      ("hvdx: neighbors float32", "HVDX_NEIGHBOR_EXCHANGE"),
                      ("hvdx: stanza conv", "HVDX_STANZA_WAIT")):
        c.expect((row, name) in found, f"no {name} on the row {row!r}: {sorted(found)}")
    c.expect(any(e.get("name") == "ALLREDUCE" for e in events), "no Horovod ALLREDUCE")
    slack = 1000  # two clocks round the timeline's start to microseconds
    outside = [e["name"] for e in ours
               if not began - start - slack <= e["ts"] <= e["ts"] + e["dur"] <=
               ended - start + slack]
    c.expect(not outside, f"events outside the window: {outside[:3]}")
    c.note(f"{len(ours)} hvdx events on {len({r for r, _ in found})} rows")


STEP_LOG_STEPS = 5


@check("step log", "each rank's file, written at exit, holds one time per step, the "
       "parameter bytes and hvdx's byte counters")
def _step_log(c: Context) -> Dict:
    """``HVDX_BENCH_STEP_LOG`` around a TopK (fast) optimizer on the device: each rank's
    file, written at exit, holds one time per step and hvdx's byte counters (the driver
    reads the files once the job has ended: :func:`check_step_log` there)."""
    from hvdx.step_log import VARIABLE

    prefix = c.shared_path("steplog")
    os.environ[VARIABLE] = prefix  # read when the optimizer is wrapped
    try:
        torch.manual_seed(0)
        model = SmallCNN().to(c.device)
        opt = c.hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
            named_parameters=model.named_parameters(),
            compression=c.hvd.Compression.topk(preset="fast"))
    finally:
        del os.environ[VARIABLE]
    x, y = (t.to(c.device) for t in fixed_batch(c.rank))
    for _ in range(STEP_LOG_STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    c.note("written at exit; read by the driver")
    return {"prefix": prefix, "ranks": c.size, "steps": STEP_LOG_STEPS,
            "parameter_bytes": parameter_bytes}


# --- hvdx bench --overlap --------------------------------------------------------------

@check("bench --overlap", "its job times every mode; decentralized modes send one model per "
       "step (CPU tensors: the bench has no device option)", launch="host")
def _bench_overlap(c: Context) -> None:
    """``hvdx bench --overlap``'s measurement, briefly: its own 2-rank job of
    digits_cnn, each mode timed, decentralized SGD's modes sending one model per step.
    The bench has no device option: its tensors are on the CPU whatever ``--device``
    says (the decentralized rows above run its exchange on the device)."""
    from hvdx.bench.overlap import run

    rows = run(("digits_cnn",), ranks=2, steps=6, rounds=2, say=lambda _: None,
               timeout=300.0)
    modes = rows[0]["modes"]
    c.expect(set(modes) == {"local", "atc", "cta"}, f"modes {sorted(modes)}")
    steps = rows[0]["steps_per_mode"]
    # Combine-then-adapt sends x_0 before the first step too: one model more per run.
    bounds = {"local": (0, 0), "atc": (1, 1), "cta": (1, (steps + 1) / steps)}
    for mode, m in modes.items():
        c.expect(m["timed_steps"] > 0 and m["median_s"] > 0, f"{mode}: no timed step")
        sent = m["sent_per_step"] / rows[0]["model_bytes"]
        low, high = bounds[mode]
        c.expect(low - 0.01 <= sent <= high + 0.01,
                 f"{mode}: {sent:.3f} models sent per step, not {low:.2f}-{high:.2f}")
    local = modes["local"]["median_s"]
    c.device = torch.device("cpu")
    c.note("CPU tensors (the bench has no device option); median step x local: " +
           ", ".join(f"{m} {modes[m]['median_s'] / local:.2f}" for m in ("atc", "cta")
                     if m in modes))


# --- the job ---------------------------------------------------------------------------

class Progress:
    """This rank's ``<prefix>.rank<R>.jsonl``, one line per event, flushed at once."""

    def __init__(self, prefix: str, rank: int):
        self.file = open(f"{prefix}.rank{rank}.jsonl", "a")

    def write(self, **event) -> None:
        # The pid: the driver ends a hung rank by it.
        self.file.write(json.dumps(dict(event, pid=os.getpid())) + "\n")
        self.file.flush()


def run_checks(names: List[str], context: Context, progress: Progress) -> None:
    """Steps 2-4 of the module docstring, for ``names`` in order."""
    for name in names:
        context.failures, context.notes = [], []
        device = context.device
        progress.write(check=name, event="start")
        began = time.perf_counter()
        after = None
        try:
            after = BODIES[name].function(context)
        except Skip as reason:
            progress.write(check=name, event="skip", seconds=time.perf_counter() - began,
                           device=str(context.device), note=str(reason))
            context.device = device
            continue
        except BaseException as error:
            progress.write(check=name, event="fail", seconds=time.perf_counter() - began,
                           device=str(context.device),
                           note=f"{type(error).__name__}: {error}".splitlines()[0][:300],
                           traceback=traceback.format_exc()[-2000:])
            raise
        seconds = time.perf_counter() - began
        failures = [f"rank {r}: {f}" for r, mine in enumerate(context.everyone(
            context.failures)) for f in mine]
        event = "fail" if failures else "pass"
        note = "; ".join(failures[:2]) if failures else "; ".join(context.notes)
        progress.write(check=name, event=event, seconds=seconds, device=str(context.device),
                       note=note, after_exit=after)
        context.device = device


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="one rank of scripts/device_check")
    parser.add_argument("--launch", choices=("main", "host"), required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--checks", required=True, help="comma-separated, in order")
    parser.add_argument("--progress", required=True, help="prefix of the progress files")
    parser.add_argument("--tmp", required=True, help="a folder every rank can write")
    args = parser.parse_args(argv)
    names = args.checks.split(",")
    unknown = [n for n in names if n not in BODIES or BODIES[n].launch != args.launch]
    if unknown:
        parser.error(f"not checks of the {args.launch} launch: {unknown}")
    torch.set_num_threads(1)
    if args.launch == "host":
        device = torch.device("cuda" if args.device == "cuda" else "cpu")
        run_checks(names, Context(None, None, device, args.tmp), Progress(args.progress, 0))
        return
    # Bitwise resumes on a GPU need cuBLAS's deterministic workspace (set by the driver);
    # an op without a deterministic kernel warns instead of failing the check.
    torch.use_deterministic_algorithms(True, warn_only=True)
    import hvdx.torch as hvd
    from mpi4py import MPI

    hvd.init(process_sets="dynamic")
    comm = MPI.COMM_WORLD
    context = Context(hvd, comm, job_device(args.device, hvd), args.tmp)
    run_checks(names, context, Progress(args.progress, comm.Get_rank()))
    comm.Barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main()
