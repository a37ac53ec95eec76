"""Stanza for torch: conv workers train the features, FC workers the head, and together
they train exactly what one process would on the concatenated global batch.

Every expectation is computed here: the reference is plain torch SGD on a copy of rank
0's initial model and the whole global batch (every rank rebuilds every batch from a
seed), the roles and byte counts are written out from the definition (the last F ranks
are FC workers; conv worker i of S takes samples [i B // S, (i + 1) B // S) of each
global batch, so that F = 1 and F = 2 train on the same batches). float64, no dropout
or batch-norm. Stanza needs two ranks: at n = 1 only the bad-input tests run.
"""

import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI

import hvdx.torch as hvd

pytestmark = [pytest.mark.stanza]

LR = 0.5
STEPS = 4
RTOL = 1e-5  # algorithms.md, section 4
ATOL = 1e-12
ACTIVATION = 6  # features' output per sample (the head's input)
CLASSES = 3


# --- models, data and the single-process reference ---------------------------------------

def features_and_head(kind="mlp", seed=0):
    """The model of rank ``seed``'s choice: ``seed=0`` is rank 0's, the one trained."""
    torch.manual_seed(seed)
    if kind == "mlp":
        features = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, ACTIVATION), nn.Tanh())
    else:
        features = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.Flatten(),
                                 nn.Linear(18, ACTIVATION), nn.Tanh())
    head = nn.Linear(ACTIVATION, CLASSES)
    return features.double(), head.double()


def global_batch(step, kind="mlp"):
    """Step ``step``'s global batch: 9 or 11 samples, so that shares are uneven."""
    g = torch.Generator().manual_seed(100 + step)
    size = 9 + 2 * (step % 2)
    shape = (5,) if kind == "mlp" else (1, 5, 5)
    return (torch.randn(size, *shape, generator=g, dtype=torch.float64),
            torch.randint(0, CLASSES, (size,), generator=g))


def conv_workers(fc_workers):
    return hvd.size() - fc_workers


def is_fc(fc_workers, rank=None):
    return (hvd.rank() if rank is None else rank) >= conv_workers(fc_workers)


def share(step, fc_workers, kind="mlp", rank=None):
    """This conv rank's part of the global batch; ``(None, None)`` on an FC rank."""
    rank = hvd.rank() if rank is None else rank
    if is_fc(fc_workers, rank):
        return None, None
    x, y = global_batch(step, kind)
    s, b = conv_workers(fc_workers), len(y)
    lo, hi = rank * b // s, (rank + 1) * b // s
    return x[lo:hi], y[lo:hi]


def reference(steps=STEPS, kind="mlp", momentum=0.0, conv_scale=1.0, head_scale=1.0):
    """Single-process SGD on the global batches: ``(features, head)`` states after each
    step. ``conv_scale`` / ``head_scale`` multiply the gradients (the pitfall test)."""
    features, head = features_and_head(kind, seed=0)
    model = nn.Sequential(features, head)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    history = []
    for step in range(steps):
        x, y = global_batch(step, kind)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        for module, scale in ((features, conv_scale), (head, head_scale)):
            for p in module.parameters():
                p.grad *= scale
        opt.step()
        history.append((clone(features), clone(head)))
    return history


def clone(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def build(kind="mlp", fc_workers=1, momentum=0.0, seed=None, micro_batches=1):
    """A trainer on this rank's own initial weights (rank 0's are broadcast)."""
    features, head = features_and_head(kind, hvd.rank() if seed is None else seed)
    opt = torch.optim.SGD(itertools.chain(features.parameters(), head.parameters()), lr=LR,
                          momentum=momentum)
    return hvd.Stanza(features, head, opt, fc_workers=fc_workers,
                      micro_batches=micro_batches), features, head


def train(trainer, steps, fc_workers=1, kind="mlp"):
    for step in steps:
        trainer.step(*share(step, fc_workers, kind))


def mine(trainer, features, head):
    """The part this rank trains and its name in the reference's pair."""
    return (1, head) if trainer.role == "fc" else (0, features)


def assert_state_close(module, state, rtol=RTOL, atol=ATOL):
    for name, value in module.state_dict().items():
        np.testing.assert_allclose(value.numpy(), state[name].numpy(), rtol=rtol, atol=atol,
                                   err_msg=name)


def everyone(value):
    return MPI.COMM_WORLD.allgather(value)


def relative_distance(a, b):
    """``max |a - b| / max |b|`` over two states."""
    return max((a[k] - b[k]).abs().max().item() / b[k].abs().max().item() for k in b)


# --- equal to single-process SGD ------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_parameters_after_every_step_equal_single_process_sgd_on_the_global_batch(kind):
    expected = reference(kind=kind)
    trainer, features, head = build(kind)
    assert trainer.role == ("fc" if is_fc(1) else "conv")
    part, module = mine(trainer, features, head)
    for step in range(STEPS):
        train(trainer, [step], kind=kind)
        assert_state_close(module, expected[step][part])


@pytest.mark.mpi(min_size=2)
def test_momentum_sgd_equals_single_process_momentum_sgd():
    expected = reference(momentum=0.9)
    trainer, features, head = build(momentum=0.9)
    part, module = mine(trainer, features, head)
    for step in range(STEPS):
        train(trainer, [step])
        assert_state_close(module, expected[step][part])


@pytest.mark.mpi(min_size=4)
def test_two_fc_workers_train_the_same_model_as_one():
    models = []
    for fc_workers in (1, 2):
        trainer, _, _ = build(fc_workers=fc_workers)
        train(trainer, range(STEPS), fc_workers)
        models.append(trainer.full_model(rank=0))
    if hvd.rank() == 0:
        one, two = (m.state_dict() for m in models)
        for name in one:
            # Only the summation order differs.
            np.testing.assert_allclose(two[name].numpy(), one[name].numpy(), rtol=1e-10,
                                       atol=ATOL, err_msg=name)
        features, head = reference()[-1]
        assert_state_close(models[1][0], features)
        assert_state_close(models[1][1], head)
    else:
        assert models == [None, None]


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("averaged", ["conv", "fc"])
def test_averaging_gradients_that_must_be_summed_would_be_caught(averaged):
    # Horovod's default Average over the S conv workers (or the F FC workers) gives 1/S
    # (1/F) of the gradient of the global mean loss: what such a bug would train is far
    # outside the tolerance of the comparison the trainer passes.
    fc_workers = 2 if averaged == "fc" else 1
    if averaged == "fc" and hvd.size() < 4:
        pytest.skip("two FC workers need four ranks")
    s = conv_workers(fc_workers)
    scales = {"conv_scale": 1 / s} if averaged == "conv" else {"head_scale": 1 / fc_workers}
    right, wrong = reference()[-1], reference(**scales)[-1]
    part = 0 if averaged == "conv" else 1
    assert relative_distance(wrong[part], right[part]) > 1000 * RTOL

    trainer, features, head = build(fc_workers=fc_workers)
    train(trainer, range(STEPS), fc_workers)
    mine_part, module = mine(trainer, features, head)
    assert_state_close(module, right[mine_part])
    if mine_part == part:
        assert relative_distance(clone(module), wrong[part]) > 100 * RTOL


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fc_workers", [1, 2])
def test_replicas_of_each_role_are_identical_after_every_step(fc_workers):
    if fc_workers > hvd.size() // 2:
        pytest.skip(f"fc_workers={fc_workers} needs {2 * fc_workers} ranks")
    trainer, features, head = build(fc_workers=fc_workers)
    for step in range(STEPS):
        train(trainer, [step], fc_workers)
        _, module = mine(trainer, features, head)
        states = everyone((trainer.role, clone(module)))
        for role in ("conv", "fc"):
            replicas = [state for r, state in states if r == role]
            for other in replicas[1:]:
                for name, value in replicas[0].items():
                    assert torch.equal(other[name], value), f"{role} {name}, step {step}"


# --- parameters without a gradient ---------------------------------------------------------

class Gated(nn.Module):
    """``base(x)``, plus ``branch(x)`` on even steps only and ``rare(x)`` only for the
    samples whose last input is positive (none, or one sample of the batch): parameters
    that get no gradient in some steps on every rank of a role, or on some of them."""

    def __init__(self, inputs, outputs):
        super().__init__()
        self.base = nn.Linear(inputs, outputs)
        self.branch = nn.Linear(inputs, outputs)
        self.rare = nn.Linear(inputs, outputs)
        self.even = True

    def forward(self, x):
        out = self.base(x)
        if self.even:
            out = out + self.branch(x)
        marked = x[:, -1:] > 0
        if marked.any():  # untaken, the branch leaves grad None (not zeros)
            out = out + torch.where(marked, self.rare(x), torch.zeros_like(out))
        return out


class GatedFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.gated = Gated(5, ACTIVATION)

    def forward(self, x):
        # The mark travels on as the last activation, for the head's rare branch.
        return torch.cat([torch.tanh(self.gated(x)), x[:, -1:]], dim=1)


def gated_model(seed=0):
    torch.manual_seed(seed)
    return GatedFeatures().double(), Gated(ACTIVATION + 1, CLASSES).double()


def gated_batch(step):
    """``global_batch``, its last input marking the first sample on odd steps only (it
    falls to conv worker 0, and to that worker's FC worker)."""
    x, y = global_batch(step)
    x = x.clone()
    x[:, -1] = -1.0
    if step % 2:
        x[0, -1] = 1.0
    return x, y


def gated_share(step, fc_workers):
    """This conv rank's part of ``gated_batch`` (as ``share``); ``(None, None)`` on an FC rank."""
    if is_fc(fc_workers):
        return None, None
    (x, y), s, r = gated_batch(step), conv_workers(fc_workers), hvd.rank()
    lo, hi = r * len(y) // s, (r + 1) * len(y) // s
    return x[lo:hi], y[lo:hi]


def take_branches(step, features, head):
    features.gated.even = head.even = step % 2 == 0


def gated_optimizer(parameters):
    return torch.optim.SGD(parameters, lr=LR, momentum=0.9, weight_decay=1e-2)


def gated_reference(steps=STEPS, zero_missing=False):
    """Plain torch on the global batches; ``zero_missing``: the defect to catch, a zero
    gradient for every parameter that got none."""
    features, head = gated_model()
    model = nn.Sequential(features, head)
    opt = gated_optimizer(model.parameters())
    history = []
    for step in range(steps):
        take_branches(step, features, head)
        x, y = gated_batch(step)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        if zero_missing:
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        opt.step()
        history.append((clone(features), clone(head)))
    return history


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fc_workers", [1, 2])
def test_parameters_without_a_gradient_keep_none_on_their_role_and_are_not_moved(fc_workers):
    # At 4 ranks a role has several ranks: three conv workers (F = 1), two of each
    # (F = 2). Branch: no gradient on any rank on odd steps. Rare: on odd steps a
    # gradient on conv worker 0 and its FC worker only, none anywhere on even ones.
    if fc_workers > hvd.size() // 2:
        pytest.skip(f"fc_workers={fc_workers} needs {2 * fc_workers} ranks")
    expected, zeroed = gated_reference(), gated_reference(zero_missing=True)
    for part in (0, 1):
        # Zero gradients let momentum and weight decay move them: far outside tolerance.
        assert relative_distance(zeroed[-1][part], expected[-1][part]) > 1000 * RTOL

    features, head = gated_model(seed=hvd.rank())
    opt = gated_optimizer(itertools.chain(features.parameters(), head.parameters()))
    trainer = hvd.Stanza(features, head, opt, fc_workers=fc_workers)
    part, module = mine(trainer, features, head)
    for step in range(STEPS):
        take_branches(step, features, head)
        trainer.step(*gated_share(step, fc_workers))
        assert_state_close(module, expected[step][part])
        missing = {name for name, p in module.named_parameters() if p.grad is None}
        branch = "branch" if step % 2 else "rare"  # the one no rank of a role takes
        assert missing == {name for name, _ in module.named_parameters() if branch in name}
        # Every rank of the role agrees, and holds the same summed gradients.
        grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
        replicas = [g for role, g in everyone((trainer.role, grads)) if role == trainer.role]
        for other in replicas[1:]:
            assert set(other) == set(grads)
            assert all(torch.equal(other[name], grads[name]) for name in grads), step


# --- what travels ------------------------------------------------------------------------

def parameter_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def summed_bytes(module):
    """A role's allreduce: its gradients and one presence flag per parameter (float64)."""
    return parameter_bytes(module) + 8 * len(list(module.parameters()))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fc_workers", [1, 2])
def test_only_activations_their_gradients_and_one_roles_gradients_travel(fc_workers):
    n, r = hvd.size(), hvd.rank()
    if fc_workers > n // 2:
        pytest.skip(f"fc_workers={fc_workers} needs {2 * fc_workers} ranks")
    trainer, features, head = build(fc_workers=fc_workers)
    s = conv_workers(fc_workers)
    # Conv worker i's FC worker is the k-th FC rank with k * S // F <= i < (k + 1) * S // F.
    groups = [[i for i in range(s) if k * s // fc_workers <= i < (k + 1) * s // fc_workers]
              for k in range(fc_workers)]
    conv_bytes, head_bytes = summed_bytes(features), summed_bytes(head)
    assert conv_bytes == (5 * 8 + 8 + 8 * 6 + 6 + 4) * 8 and head_bytes == (6 * 3 + 3 + 2) * 8
    item = 8  # float64 activations, int64 labels
    for step in range(STEPS):
        train(trainer, [step], fc_workers)
        sent, received = trainer.stats.last_sent, trainer.stats.last_received
        sizes = [len(share(step, fc_workers, rank=i)[1]) for i in range(s)]
        if r < s:
            b = sizes[r]
            expected_sent = {"activations": b * ACTIVATION * item + b * item,
                             "conv_allreduce": conv_bytes if s > 1 else 0}
            expected_received = {"activation_gradients": b * ACTIVATION * item,
                                 "conv_allreduce": conv_bytes if s > 1 else 0,
                                 "control": 8}  # the loss of its batch
            # Activations out and their gradients back: 2 * batch * activation size.
            assert sent["activations"] - b * item + received["activation_gradients"] == \
                2 * b * ACTIVATION * item
        else:
            served = [sizes[i] for i in groups[r - s]]
            several = fc_workers > 1
            expected_sent = {"activation_gradients": sum(served) * ACTIVATION * item,
                             "fc_allreduce": head_bytes if several else 0,
                             "control": 8 * len(served) + (8 if several else 0)}
            expected_received = {"activations": sum(served) * (ACTIVATION + 1) * item,
                                 "fc_allreduce": head_bytes if several else 0,
                                 "control": 8 if several else 0}
        # Every kind not listed is zero: no message of a conv worker holds the head.
        assert sent == {kind: expected_sent.get(kind, 0) for kind in sent}, (step, r)
        assert received == {kind: expected_received.get(kind, 0) for kind in received}, \
            (step, r)
    assert trainer.stats.steps == STEPS


# --- the whole model, checkpoints ------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("target", ["rank 0", "last rank (an FC worker)"])
def test_full_model_is_single_process_sgds_model_with_the_original_layer_names(target):
    n = hvd.size()
    rank = 0 if target == "rank 0" else n - 1
    features, head = features_and_head(seed=hvd.rank())
    model = nn.Sequential(*features, head)  # layers "0" .. "4"
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = hvd.Stanza(model, split=4, optimizer=opt)
    train(trainer, range(STEPS))
    full = trainer.full_model(rank=rank)
    if hvd.rank() != rank:
        assert full is None
        return
    assert list(full.state_dict()) == list(model.state_dict())
    expected_features, expected_head = reference()[-1]
    expected = {**expected_features, "4.weight": expected_head["weight"],
                "4.bias": expected_head["bias"]}
    assert_state_close(full, expected)
    x, _ = global_batch(0)
    assert full(x).shape == (len(x), CLASSES)
    assert full[0] is not model[0]  # a copy: training on does not change it


@pytest.mark.mpi(min_size=2)
def test_resuming_from_a_checkpoint_is_bitwise_an_uninterrupted_run(tmp_path):
    stop = 2
    path = hvd.broadcast_object(str(tmp_path / "stanza.pt"), root_rank=0, name="stanza.path")
    straight, features, head = build(momentum=0.9)
    train(straight, range(STEPS))
    uninterrupted = clone(mine(straight, features, head)[1])

    first, _, _ = build(momentum=0.9)
    train(first, range(stop))
    hvd.save_checkpoint(path, first)
    resumed, features, head = build(momentum=0.9, seed=hvd.rank() + 7)  # other weights
    hvd.load_checkpoint(path, resumed)
    train(resumed, range(stop, STEPS))
    for name, value in mine(resumed, features, head)[1].state_dict().items():
        assert torch.equal(value, uninterrupted[name]), name
    a, b = straight.full_model(0), resumed.full_model(0)
    if hvd.rank() == 0:
        assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(),
                                                     b.state_dict().values()))


# --- bad input: the same ValueError on every rank, no hang -------------------------------

def the_same_everywhere(error):
    """This rank's message, after checking that every rank raised the same."""
    messages = everyone(str(error.value))
    assert len(set(messages)) == 1, messages
    return messages[0]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("fc_workers", [0, "size", 1.5])
def test_bad_fc_workers_fail_on_every_rank_naming_the_value_and_the_world_size(fc_workers):
    n = hvd.size()
    fc_workers = n if fc_workers == "size" else fc_workers
    with pytest.raises(ValueError) as error:
        build(fc_workers=fc_workers)
    message = the_same_everywhere(error)
    assert f"fc_workers={fc_workers!r}" in message and f"world of {n} ranks" in message


@pytest.mark.mpi(min_size=1)
def test_a_head_without_parameters_fails_on_every_rank():
    features, _ = features_and_head()
    opt = torch.optim.SGD(features.parameters(), lr=LR)
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, nn.Flatten(), opt)
    assert "head (Flatten) has no parameters" in the_same_everywhere(error)


@pytest.mark.mpi(min_size=2)
def test_one_rank_with_another_fc_workers_fails_on_every_rank():
    fc_workers = 2 if hvd.rank() == hvd.size() - 1 else 1
    with pytest.raises(ValueError) as error:
        build(fc_workers=fc_workers)
    assert "fc_workers" in the_same_everywhere(error)


@pytest.mark.mpi(min_size=2)
def test_features_that_do_not_fit_the_head_fail_every_rank_at_the_first_step():
    features, _ = features_and_head()
    head = nn.Linear(ACTIVATION - 1, CLASSES).double()  # takes 5 features, gets 6
    opt = torch.optim.SGD(itertools.chain(features.parameters(), head.parameters()), lr=LR)
    trainer = hvd.Stanza(features, head, opt)
    with pytest.raises(ValueError) as error:
        trainer.step(*share(0, 1))
    message = the_same_everywhere(error)
    assert "per sample [6]" in message and "in_features=5" in message
    assert trainer.stats.last_received["activation_gradients"] == 0


@pytest.mark.mpi(min_size=2)
def test_a_conv_worker_without_a_batch_fails_every_rank_at_the_first_step():
    trainer, _, _ = build()
    x, y = share(0, 1)
    with pytest.raises(ValueError) as error:
        trainer.step(None if hvd.rank() == 0 else x, y)
    assert "rank 0 is a conv worker and needs a batch" in the_same_everywhere(error)


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("fault", ["features fail", "labels differ"])
def test_one_conv_workers_bad_batch_fails_every_rank_at_the_first_step(fault):
    trainer, _, _ = build("conv")
    x, y = share(0, 1, "conv")
    if hvd.rank() == 1 and fault == "features fail":
        x = torch.randn(len(y), 1, 6, 6, dtype=torch.float64)  # 32 features, not 18
    if hvd.rank() == 1 and fault == "labels differ":
        y = y.int()
    with pytest.raises(ValueError) as error:
        trainer.step(x, y)
    message = the_same_everywhere(error)
    if fault == "features fail":
        assert "rank 1: features(x) raised RuntimeError" in message
    else:
        assert ("the conv workers' batches differ: rank 0's gives activations [*, 6] "
                "torch.float64, labels [*] torch.int64, rank 1's gives activations [*, 6] "
                "torch.float64, labels [*] torch.int32") in message


@pytest.mark.mpi(min_size=2)
def test_after_a_first_step_that_failed_everywhere_the_next_one_checks_again_and_trains():
    # Labels out of range on rank 0: the loss fails on the FC worker, every rank raises,
    # nothing is stepped; the next step agrees on the data again and training proceeds
    # as if the failed step had not been taken.
    expected = reference()
    trainer, features, head = build()
    x, y = share(0, 1)
    with pytest.raises(ValueError) as error:
        trainer.step(x, y + CLASSES if hvd.rank() == 0 else y)
    assert "loss_fn cannot take the head's output" in the_same_everywhere(error)
    assert trainer.stats.steps == 0
    part, module = mine(trainer, features, head)
    for step in range(2):
        train(trainer, [step])
        assert_state_close(module, expected[step][part])


@pytest.mark.mpi(min_size=2)
def test_a_state_of_another_layout_fails_on_every_rank_and_loads_nothing():
    trainer, features, head = build()
    train(trainer, range(1))
    state = copy.deepcopy(trainer.state_dict())
    _, module = mine(trainer, features, head)
    before = clone(module)
    state["layout"]["fc_workers"] = 2
    with pytest.raises(ValueError) as error:
        trainer.load_state_dict(state)
    message = the_same_everywhere(error)
    assert "rank 0's state was saved as a conv worker (rank 0)" in message
    assert "fc_workers=2" in message and "fc_workers=1" in message
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


@pytest.mark.mpi(min_size=2)
def test_full_model_for_a_rank_outside_the_job_fails_on_every_rank():
    trainer, _, _ = build()
    with pytest.raises(ValueError) as error:
        trainer.full_model(rank=hvd.size())
    assert f"rank={hvd.size()} is not a rank" in the_same_everywhere(error)


# --- fc_workers="auto" ----------------------------------------------------------------------

def build_auto(features, head, example):
    opt = torch.optim.SGD(itertools.chain(features.parameters(), head.parameters()), lr=LR)
    return hvd.Stanza(features, head, opt, fc_workers="auto", example=example)


@pytest.mark.mpi(min_size=2)
def test_auto_takes_the_smallest_f_whose_head_keeps_up_on_every_rank_and_trains_the_same():
    n = hvd.size()
    features, head = features_and_head(seed=hvd.rank())
    example = global_batch(0)[0][:3]
    trainer = build_auto(features, head, example)
    probe = trainer.probe
    assert len({repr(p) for p in everyone(probe)}) == 1  # one agreed probe, one choice
    # The definition, written out: the busiest FC worker runs ceil(S / F) batches.
    expected = next((f for f in range(1, n // 2 + 1)
                     if probe["head_s"][-(-(n - f) // f) * 3] <= probe["conv_s"]), n // 2)
    assert probe["fc_workers"] == trainer.roles.fc_workers == expected
    # The probe ran on copies: training from here is single-process SGD, as with a number.
    fc_workers = trainer.roles.fc_workers
    part, module = mine(trainer, features, head)
    reference_states = reference(steps=2)
    for step in range(2):
        trainer.step(*share(step, fc_workers))
        assert_state_close(module, reference_states[step][part])


@pytest.mark.mpi(min_size=4)
def test_auto_gives_a_heavy_head_as_many_fc_workers_as_allowed_and_a_light_one_one():
    torch.manual_seed(0)
    light = nn.Linear(5, ACTIVATION)
    heavy = nn.Sequential(nn.Linear(ACTIVATION, 1500), nn.Tanh(), nn.Linear(1500, 1500),
                          nn.Tanh(), nn.Linear(1500, CLASSES))
    example = torch.randn(8, 5)
    assert build_auto(light, heavy, example).roles.fc_workers == hvd.size() // 2
    deep = nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(5 if _ == 0 else 400, 400),
                                                           nn.Tanh())],
                         nn.Linear(400, ACTIVATION))
    assert build_auto(deep, nn.Linear(ACTIVATION, CLASSES), example).roles.fc_workers == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("example", ["none", "wrong shape"])
def test_auto_without_a_fitting_example_fails_on_every_rank(example):
    if example == "wrong shape" and hvd.size() < 2:
        pytest.skip("alone, Stanza refuses the world size before it probes")
    features, head = features_and_head()
    example = None if example == "none" else torch.randn(4, 7, dtype=torch.float64)
    with pytest.raises(ValueError) as error:
        build_auto(features, head, example)
    message = the_same_everywhere(error)
    if example is None:
        assert "fc_workers='auto'" in message and "pass example=" in message
    else:
        assert "example (a torch.float64 tensor of shape (4, 7)) does not go through" in message


# --- micro-batches ---------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("micro_batches", [2, 5])
def test_micro_batches_train_the_same_model_as_single_process_sgd(micro_batches):
    # 5 parts of a conv worker's 4 or 5 samples: some parts are empty.
    fc_workers = 2 if hvd.size() >= 4 else 1
    expected = reference(kind="conv", momentum=0.9)
    trainer, features, head = build("conv", fc_workers, momentum=0.9,
                                    micro_batches=micro_batches)
    part, module = mine(trainer, features, head)
    for step in range(STEPS):
        trainer.step(*share(step, fc_workers, "conv"))
        assert_state_close(module, expected[step][part])


@pytest.mark.mpi(min_size=2)
def test_micro_batches_move_the_same_activations_plus_one_batch_size_per_conv_worker():
    trainer, _, _ = build(micro_batches=3)
    x, y = share(0, 1)
    loss = trainer.step(x, y)
    sent, received = trainer.stats.last_sent, trainer.stats.last_received
    s = conv_workers(1)
    if trainer.role == "conv":
        assert sent["activations"] == len(y) * (ACTIVATION * 8 + 8)
        assert received["activation_gradients"] == len(y) * ACTIVATION * 8
        # Its batch size, and one loss per part.
        assert sent["control"] == 8 and received["control"] == 3 * 8
        # The loss is the mean over its samples, as without micro-batches.
        features, head = features_and_head(seed=0)
        np.testing.assert_allclose(loss, F.cross_entropy(head(features(x)), y).item(),
                                   rtol=1e-12)
    else:
        assert received["activations"] == len(global_batch(0)[1]) * (ACTIVATION * 8 + 8)
        assert received["control"] == 8 * s and sent["control"] == 3 * 8 * s


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("micro_batches", [0, 1.5, True])
def test_bad_micro_batches_fail_on_every_rank(micro_batches):
    with pytest.raises(ValueError) as error:
        build(micro_batches=micro_batches)
    assert f"micro_batches={micro_batches!r}" in the_same_everywhere(error)


@pytest.mark.mpi(min_size=2)
def test_with_an_example_a_head_that_does_not_fit_fails_at_construction_naming_both_shapes():
    features, _ = features_and_head()
    head = nn.Linear(ACTIVATION + 1, CLASSES).double()
    opt = torch.optim.SGD(itertools.chain(features.parameters(), head.parameters()), lr=LR)
    before = clone(features)
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, head, opt, example=global_batch(0)[0][:3])
    message = the_same_everywhere(error)
    assert f"activations of shape (3, {ACTIVATION})" in message
    assert f"in_features={ACTIVATION + 1}" in message
    assert all(torch.equal(v, before[k]) for k, v in features.state_dict().items())
    assert features.training and head.training  # the check put the modes back
