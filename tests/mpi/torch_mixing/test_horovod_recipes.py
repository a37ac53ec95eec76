"""Horovod's own recipes under every hvdx strategy: each works as under Horovod, or is
refused on every rank that meets it, with what to do instead; none hangs and none
diverges silently.

- the rank-0 resume recipe: rank 0 alone reads a checkpoint (``state_dict`` and
  ``load_state_dict`` are local), then ``broadcast_parameters`` and
  ``broadcast_optimizer_state`` give every rank the root's state, and the ranks that
  average gradients train one model on (a new job does the same in
  ``tests/launch/test_resume_in_a_new_job.py``);
- a second ``DistributedOptimizer`` in the same job, after the first trained and
  saved or loaded;
- "save checkpoints only on worker 0" with hvdx's collective ``save_checkpoint``: an
  error within the timeout, not a hang;
- ``process_set=``: TopK runs inside the set, the ranks outside step alone (as Horovod's
  optimizer does); the parameter-mixing strategies refuse it;
- ``hvd.join()``: under TopK the joined ranks count as zeros, as under Horovod's join;
  refused while a parameter-mixing strategy trains.

This job runs with dynamic process sets (DS-Sync's groups need them, and the process
set recipe registers sets of its own).
"""

import copy
import gc
import io

import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

LR = 0.1

STRATEGIES = {
    "horovod": lambda: {},
    "topk": lambda: {"compression": hvd.Compression.topk(0.1, 0.05, min_size=0)},
    "topk-sharded": lambda: {"compression": hvd.Compression.topk(
        0.1, 0.05, min_size=0, mode="sharded")},
    # DGC's momentum correction: the presets', and one where every tensor is compressed.
    "fast": lambda: {"compression": hvd.Compression.topk(preset="fast")},
    "safe": lambda: {"compression": hvd.Compression.topk(preset="safe")},
    "topk-momentum": lambda: {"compression": hvd.Compression.topk(
        0.1, 0.05, min_size=0, momentum_correction=True)},
    "dssync": lambda: {"sync": hvdx.DSSync("shuffle", group_size=min(2, hvd.size()),
                                           seed=3, swa_start=1)},
    "decentralized": lambda: {"sync": hvdx.Decentralized("one-peer-exp")},
}
#: The strategies that average gradients: one model on every rank, always.
ONE_MODEL = ("horovod", "topk", "topk-sharded", "fast", "safe", "topk-momentum")
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=0.01),
    "adam": lambda params: torch.optim.Adam(params, lr=LR),
}


class Net(nn.Module):
    """Two layers, the first above the presets' ``min_size`` (1,040 weights: TopK
    compresses it while the small tensors stay dense), and a layer that never receives a
    gradient: a parameter-mixing strategy's local step gives it no optimizer state."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 130)
        self.out = nn.Linear(130, 2)
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def build(strategy, optimizer="sgd", seed=None):
    torch.manual_seed(hvd.rank() if seed is None else seed)
    model = Net()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[optimizer](model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   **STRATEGIES[strategy]())
    return model, opt


def train(model, opt, steps, finish=True):
    """``finish=False``: leave a decentralized exchange in flight, as a training loop
    does between its steps."""
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + hvd.rank())
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    if finish and hasattr(opt, "hvdx_graph"):
        opt.synchronize()  # complete decentralized SGD's exchange in flight


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def base_state(opt):
    """The wrapped optimizer's per-parameter state tensors, in a fixed order."""
    state = opt.state_dict()["state"]
    return [t.clone() for key in sorted(state) for name, t in sorted(state[key].items())
            if torch.is_tensor(t)]


def same_everywhere(value, name):
    everyone = hvd.allgather_object(value, name=name)
    return all(torch.equal(v, everyone[0]) if torch.is_tensor(v) else v == everyone[0]
               for v in everyone)


def one_model_after_training(strategy):
    """Whether the ranks must hold one model after training: always when gradients are
    averaged; under parameter mixing where the mix is the average over all ranks (one
    group of every rank; one peer of two ranks)."""
    return strategy in ONE_MODEL or hvd.size() <= 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy,optimizer", [
    (s, o) for s in sorted(STRATEGIES) for o in sorted(OPTIMIZERS)
    # (momentum correction given by hand takes SGD only, and refuses Adam)
    if (s, o) != ("topk-momentum", "adam")])
def test_the_rank0_resume_recipe_gives_every_rank_the_roots_state(strategy, optimizer):
    """Horovod's recipe within one job, with a parameter that never has a gradient: the
    first optimizer trains (its last exchange still in flight), rank 0 saves; a second
    model and optimizer are built, rank 0 alone loads, the broadcasts give every rank
    the root's state, and training goes on with one model where there must be one."""
    model, opt = build(strategy, optimizer)
    train(model, opt, range(3), finish=False)
    saved = io.BytesIO()
    if hvd.rank() == 0:  # Horovod's habit: rank 0 alone saves, and alone loads
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
        root_params = flat(model)
    else:
        root_params = None
    root_params = hvd.broadcast_object(root_params, root_rank=0, name="root.params")

    resumed, opt = build(strategy, optimizer, seed=100 + hvd.rank())
    if hvd.rank() == 0:
        saved.seek(0)
        checkpoint = torch.load(saved, weights_only=False)
        resumed.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
    root_state = hvd.broadcast_object(base_state(opt), root_rank=0, name="root.state")
    hvd.broadcast_parameters(resumed.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    if strategy != "horovod":
        # (Horovod's own function creates the state by a step on zero gradients after
        # broadcast_parameters, which moves the other ranks' parameters by weight decay.)
        assert torch.equal(flat(resumed), root_params), "the parameters are not the root's"
    mine = base_state(opt)
    assert len(mine) == len(root_state)
    assert all(torch.equal(a, b) for a, b in zip(mine, root_state)), \
        "the optimizer's state is not the root's"
    train(resumed, opt, range(3, 6))
    # Horovod's own function moved the other ranks by weight decay (above): as in
    # Horovod, its ranks agree only without it.
    horovods_decay = strategy == "horovod" and optimizer == "sgd"
    if one_model_after_training(strategy) and not horovods_decay:
        assert same_everywhere(flat(resumed), "resumed.params"), \
            f"{strategy}: the ranks' parameters differ after resuming"
    hvdx_state = {k: v for k, v in opt.state_dict().items() if k.startswith("hvdx")}
    for entry in hvdx_state.values():  # the schedule's step is the same everywhere
        assert same_everywhere(entry["step"], "resumed.step")


@pytest.mark.up_to_two_ranks('two optimizers of one model alternate as in a GAN')
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_two_optimizers_train_alternately_as_in_a_gan(strategy):
    """A generator's and a critic's ``DistributedOptimizer`` step in turn, each on its
    own loss (the critic frozen while the generator learns, as Horovod's hooks need),
    with one model of each where there must be one."""
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
    critic = Net()
    g_opt, c_opt = (hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9),
        named_parameters=m.named_parameters(), **STRATEGIES[strategy]())
        for m in (generator, critic))
    for step in range(4):
        g = torch.Generator().manual_seed(1000 * step + hvd.rank())
        z, real = torch.randn(8, 4, generator=g), torch.randn(8, 8, generator=g)
        c_opt.zero_grad()
        (critic(generator(z).detach()).mean() - critic(real).mean()).backward()
        c_opt.step()
        critic.requires_grad_(False)
        g_opt.zero_grad()
        (-critic(generator(z)).mean()).backward()
        g_opt.step()
        critic.requires_grad_(True)
    for opt in (g_opt, c_opt):
        if hasattr(opt, "finish_mixing"):
            opt.synchronize()
    both = torch.cat([flat(generator), flat(critic)])
    assert torch.isfinite(both).all()
    if one_model_after_training(strategy):
        assert same_everywhere(both, "gan.params"), f"{strategy}: the ranks differ"


@pytest.mark.up_to_two_ranks("rank 0's one line")
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", ["fast", "topk"])
def test_rank0_says_once_that_the_roots_residuals_are_not_copied(strategy, capfd,
                                                                  monkeypatch):
    """TopK's residuals (and compressed velocities) are each rank's own: the resume
    recipe does not copy the root's, and rank 0 says so once, however many times the
    state is broadcast; the other ranks say nothing."""
    from hvdx.torch import optimizer_state

    monkeypatch.setattr(optimizer_state, "_said", set())
    model, opt = build(strategy)
    train(model, opt, range(2))
    capfd.readouterr()
    for _ in range(2):
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    said = capfd.readouterr().err.count("broadcast_optimizer_state: each rank keeps its "
                                        "own TopK residuals")
    assert said == (1 if hvd.rank() == 0 else 0)


@pytest.mark.up_to_two_ranks("a second optimizer after the first's state round trip")
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_second_optimizer_trains_after_the_first_saved_and_loaded(strategy):
    """Two ``DistributedOptimizer`` objects in one job, one after the other: the first
    trains, saves and loads its own state on every rank, and stays alive; the second,
    over a new model from the same weights, trains as a lone first optimizer would (the
    first's result, replayed), with one model where there must be one."""
    torch.manual_seed(0)
    reference = Net()
    start = copy.deepcopy(reference.state_dict())
    first = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](reference.parameters()),
                                     named_parameters=reference.named_parameters(),
                                     **STRATEGIES[strategy]())
    train(reference, first, range(4))
    first.load_state_dict(first.state_dict())
    expected = flat(reference)

    second_model = Net()
    second_model.load_state_dict(start)
    second = hvd.DistributedOptimizer(OPTIMIZERS["sgd"](second_model.parameters()),
                                      named_parameters=second_model.named_parameters(),
                                      **STRATEGIES[strategy]())
    train(second_model, second, range(4))
    assert torch.equal(flat(second_model), expected)
    if one_model_after_training(strategy):
        assert same_everywhere(flat(second_model), "second.params")
    train(reference, first, range(4, 5))  # the first still works
    assert first is not second


@pytest.mark.up_to_two_ranks('a save on rank 0 alone times out there')
@pytest.mark.mpi(min_size=2)
def test_saving_on_rank_0_alone_fails_there_within_the_timeout(monkeypatch, tmp_path):
    monkeypatch.setenv("HVDX_CHECKPOINT_TIMEOUT", "1")
    model, opt = build("topk")
    if hvd.rank() == 0:
        with pytest.raises(RuntimeError, match=r"rank\(s\) \[1.*call save_checkpoint on "
                                               r"every rank"):
            hvd.save_checkpoint(tmp_path / "ckpt.pt", model, opt)
    hvd.barrier()
    # Nothing is left behind: the same call on every rank works right after.
    path = hvd.broadcast_object(str(tmp_path / "ckpt.pt"), root_rank=0, name="ckpt.path")
    hvd.save_checkpoint(path, model, opt, epoch=1)
    assert hvd.load_checkpoint(path, model, opt) == {"epoch": 1}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compression", ["none", "topk"])
def test_a_process_set_averages_inside_it_and_the_others_step_alone(compression):
    """Horovod's ``test_optimizer_process_sets``, against plain torch, with no strategy
    (hvdx passes it to Horovod) and with TopK: ratio 1 is the dense average over the
    set's members; a rank outside it steps on its own gradient. (All ranks but the
    last: DS-Sync's tests in this job register pairs already.)"""
    members = hvd.add_process_set(list(range(hvd.size() - 1)))
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        start = [p.detach().clone() for p in model.parameters()]
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=LR),
            named_parameters=model.named_parameters(), process_set=members,
            compression=hvd.Compression.topk(1.0, 1.0, min_size=0)
            if compression == "topk" else hvd.Compression.none)

        def gradients(rank):
            reference = nn.Linear(4, 3)
            with torch.no_grad():
                for p, s in zip(reference.parameters(), start):
                    p.copy_(s)
            g = torch.Generator().manual_seed(rank)
            x, y = torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)
            ((reference(x) - y) ** 2).mean().backward()
            return [p.grad for p in reference.parameters()]

        g = torch.Generator().manual_seed(hvd.rank())
        x, y = torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()

        ranks = members.ranks if members.included() else [hvd.rank()]
        each = [gradients(r) for r in ranks]
        for p, s, *gs in zip(model.parameters(), start, *each):
            expected = s - LR * torch.stack(gs).mean(0)
            assert torch.allclose(p.detach(), expected, atol=1e-6)
    finally:
        hvd.remove_process_set(members)


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("strategy", ["dssync", "decentralized"])
def test_parameter_mixing_refuses_a_process_set_on_every_rank(strategy):
    members = hvd.add_process_set(list(range(hvd.size() - 1)))
    try:
        model = nn.Linear(3, 2)
        with pytest.raises(ValueError, match="process_set"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                     named_parameters=model.named_parameters(),
                                     process_set=members, **STRATEGIES[strategy]())
    finally:
        hvd.remove_process_set(members)


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stanza", [hvd.Stanza, "instance"], ids=["class", "instance"])
def test_stanza_as_sync_is_refused_on_every_rank_naming_the_trainer(stanza):
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if stanza == "instance":
        stanza = hvd.Stanza(model, None, opt, split=1) if hvd.size() > 1 else hvd.Stanza
    with pytest.raises(ValueError, match=r"sync=Stanza: Stanza is a trainer.*trainer.step"):
        hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                 sync=stanza)


@pytest.mark.up_to_two_ranks('a refusal')
@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", ["dssync", "decentralized"])
def test_join_is_refused_while_a_parameter_mixing_strategy_trains(strategy):
    model, opt = build(strategy)
    train(model, opt, range(1))
    with pytest.raises(ValueError, match=r"hvd.join\(\): not supported .*DistributedSampler"):
        hvd.join()


def uneven(strategy_kwargs, steps_then):
    """Rank r takes ``4 - r % 3`` steps on its own data, then joins; then every rank
    takes ``steps_then`` more steps. Returns the parameters after the join and at the
    end, and what ``join`` returned."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 40), nn.Tanh(), nn.Linear(40, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   **strategy_kwargs)
    mine = 4 - hvd.rank() % 3
    train(model, opt, range(mine))
    last = hvd.join()
    joined = flat(model)
    train(model, opt, range(10, 10 + steps_then))
    return joined, flat(model), last, opt


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["gathered", "sharded", "autotune"])
def test_join_under_topk_at_ratio_1_is_horovods_join(mode):
    """The ranks that ran out of data count as zeros in the others' averages, as under
    Horovod's join, and all ranks go on training together afterwards (``autotune``:
    the join falls into its dense tuning steps and its decision)."""
    options = {"autotune_steps": 2} if mode == "autotune" else {"mode": mode}
    ours = uneven({"compression": hvd.Compression.topk(1.0, 1.0, min_size=0, **options)}, 2)
    theirs = uneven({}, 2)
    for a, b in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # The rank that joined last is one of those with the most steps (which one of them
    # is a race), and every rank is told the same.
    assert 4 - ours[2] % 3 == 4 and same_everywhere(ours[2], f"join.last.{mode}")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("compression", ["layerwise", "global", "fast"])
def test_join_under_topk_leaves_the_joined_ranks_residuals_and_keeps_one_schedule(
        compression):
    spec = {"layerwise": lambda: hvd.Compression.topk(0.1, 0.05, min_size=0),
            "global": lambda: hvd.Compression.topk(0.1, 0.05, min_size=0,
                                                   selection="global"),
            "fast": lambda: hvd.Compression.topk(preset="fast")}[compression]()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 40), nn.Tanh(), nn.Linear(40, 2))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
        named_parameters=model.named_parameters(), compression=spec)
    train(model, opt, range(4 - hvd.rank() % 3))
    before = opt.state_dict()
    params = flat(model)
    hvd.join()
    after = opt.state_dict()
    # The joined rank's parameters, residuals and velocities sat the others' steps out;
    # its step counter went on with theirs.
    assert torch.equal(flat(model), params)
    for side in ("worker",) + (("velocity",) if "velocity" in before["hvdx_topk"] else ()):
        mine, now = before["hvdx_topk"][side], after["hvdx_topk"][side]
        assert mine.keys() == now.keys()
        assert all(torch.equal(mine[k], now[k]) for k in mine)
    assert same_everywhere(after["hvdx_topk"]["step"], f"join.step.{compression}")
    train(model, opt, range(10, 12))  # every rank trains on together
    step = opt.state_dict()["hvdx_topk"]["step"]
    assert step == after["hvdx_topk"]["step"] + 2
    assert same_everywhere(step, f"join.after.{compression}")


@pytest.mark.up_to_two_ranks("Horovod's join, untouched")
@pytest.mark.mpi(min_size=1)
def test_join_is_horovods_once_no_strategy_trains():
    model, opt = build("horovod")
    gc.collect()  # the optimizers of earlier tests
    last = hvd.join()
    assert 0 <= last < hvd.size() and same_everywhere(last, "join.last")
