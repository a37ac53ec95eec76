"""DS-Sync with probe_every: the rotation is rebuilt from the bandwidth matrix at the
same step on every rank, only when the groups change, survives a checkpoint, and the
real probe runs inside training without a hang."""

import copy
import pathlib
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd
from hvdx.core.topology import Topology
from hvdx.strategies.dssync.spec import DSSync

STATE_KEY = DSSync.state_key

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from spec_errors import refused  # noqa: E402

pytestmark = [pytest.mark.dssync]

MBIT = 1e6 / 8


def cluster_matrix(n, slow_rank=None):
    """2 racks of n/2 hosts: 1gbit inside, 100mbit across; slow_rank's NIC at 10mbit."""
    rack = np.arange(n) // max(n // 2, 1)
    m = np.where(rack[:, None] == rack[None, :], 1000 * MBIT, 100 * MBIT)
    if slow_rank is not None:
        m[slow_rank, :] = m[:, slow_rank] = 10 * MBIT
    np.fill_diagonal(m, 0)
    return m


def contended_from(step_slowed):
    """A probe whose answer changes at ``step_slowed``: rank 0's NIC slows down."""
    def probe(step):
        return cluster_matrix(hvd.size(), 0 if step >= step_slowed else None)
    return probe


def make(seed_rank, sync, lr=0.1):
    torch.manual_seed(seed_rank)
    model = nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(), sync=sync)
    return model, opt


def train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(100 * step + hvd.rank())
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def two_racks():
    n = hvd.size()
    return Topology.from_counts(racks=2, hosts_per_rack=n // 2)


@pytest.mark.mpi(min_size=4)
def test_a_slowed_nic_moves_the_crossing_at_the_same_step_on_every_rank():
    sync = hvdx.DSSync(topology=two_racks(), cross_ranks=1, probe_every=3,
                       probe=contended_from(5))
    model, opt = make(hvd.rank(), sync)
    train(model, opt, 2)  # step 1 crosses: the first rank of each rack
    assert opt.hvdx_stats.last_group_size == (2 if hvd.rank() in (0, hvd.size() // 2) else 1)
    train(model, opt, 8, start=2)
    stats = opt.hvdx_stats
    # Probes at steps 3 (calm), 6 (rank 0 slowed: rebuilt) and 9 (same: nothing to do).
    assert (stats.probes, stats.adaptations) == (3, 1)
    everyone = hvd.allgather_object((stats.probes, stats.adaptations,
                                     stats.last_adaptation_step))
    assert everyone == [(3, 1, 6)] * hvd.size()
    train(model, opt, 1, start=10)  # step 10 is intra, 11 crosses
    train(model, opt, 1, start=11)
    crossing = {1, hvd.size() // 2}
    assert opt.hvdx_stats.last_group_size == (2 if hvd.rank() in crossing else 1)


@pytest.mark.mpi(min_size=4)
def test_adaptation_keeps_the_number_of_crossing_ranks_the_link_rates_chose():
    # 1 Gbit NICs and a 100 Mbit uplink: the cost of crossing picks one rank per rack
    # (cross_ranks left to it). A probe moves *who* crosses, never how many.
    sync = hvdx.DSSync(topology=two_racks(), link_rates=("1gbit", "100mbit"), probe_every=2,
                       probe=contended_from(0))
    model, opt = make(hvd.rank(), sync)
    assert opt._hvdx_groups.schedule.cross_ranks == 1
    train(model, opt, 3)
    assert opt.hvdx_stats.adaptations == 1
    assert opt._hvdx_groups.schedule.cross_ranks == 1
    assert opt._hvdx_groups.schedule.places[:2] == (1, 0)


@pytest.mark.mpi(min_size=2)
def test_a_calm_network_never_rebuilds_and_steps_stay_identical():
    sync = hvdx.DSSync(topology=two_racks() if hvd.size() >= 4 else None, cross_ranks=1,
                       probe_every=2, probe=lambda step: cluster_matrix(hvd.size()))
    plain = hvdx.DSSync(topology=sync.topology, cross_ranks=1)
    model, opt = make(hvd.rank(), sync)
    ref, ref_opt = make(hvd.rank(), plain)
    train(model, opt, 6)
    train(ref, ref_opt, 6)
    assert (opt.hvdx_stats.probes, opt.hvdx_stats.adaptations) == (2, 0)
    assert torch.equal(flat(model), flat(ref))
    assert STATE_KEY in opt.state_dict() and "adapted" not in opt.state_dict()[STATE_KEY]


@pytest.mark.mpi(min_size=2)
def test_the_real_probe_runs_inside_training_without_a_hang():
    sync = hvdx.DSSync(probe_every=2, probe_bytes=2**16)
    model, opt = make(hvd.rank(), sync)
    train(model, opt, 5)
    assert opt.hvdx_stats.probes == 2
    assert opt.hvdx_stats.probe_seconds > 0


@pytest.mark.mpi(min_size=4)
def test_a_resumed_run_continues_on_the_adapted_rotation():
    sync = hvdx.DSSync(topology=two_racks(), cross_ranks=1, probe_every=2,
                       probe=contended_from(0))
    model, opt = make(hvd.rank(), sync)
    train(model, opt, 3)  # adapted at step 2
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    assert saved_opt[STATE_KEY]["adapted"]["places"][:2] == [1, 0]
    train(model, opt, 3, start=3)

    # The resumed run's probe would not see the contention: only the checkpoint can
    # give it the adapted rotation (and its next probe, at step 4, sees it again).
    resumed, opt2 = make(hvd.rank() + 100, hvdx.DSSync(
        topology=two_racks(), cross_ranks=1, probe_every=2, probe=contended_from(0)))
    resumed.load_state_dict(saved_model)
    opt2.load_state_dict(saved_opt)
    train(resumed, opt2, 3, start=3)
    assert torch.equal(flat(resumed), flat(model))
    assert opt2.hvdx_stats.adaptations == 1


def test_probe_every_is_validated_naming_it():
    refused(lambda: hvdx.DSSync(probe_every=-1), "probe_every=-1")
    refused(lambda: hvdx.DSSync("shuffle", group_size=1, probe_every=5),
            "probe_every=5 applies to schedule='rotation'")
    refused(lambda: hvdx.DSSync(probe_every=5, probe_bytes=0), "probe_bytes=0")
    refused(lambda: hvdx.DSSync(probe_every=5, probe=3), "probe=3")
