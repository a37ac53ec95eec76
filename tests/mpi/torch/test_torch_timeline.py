"""Horovod's timeline holds hvdx's own exchanges next to Horovod's ops.

A timeline is configured at ``hvd.init()`` (``HOROVOD_TIMELINE``), and this job's
Horovod was initialised without one: the test shuts Horovod down, initialises it again
with a timeline, trains a few TopK, decentralized and Stanza steps, and closes the file both
ways hvdx merges after (``hvd.stop_timeline()`` of ``HOROVOD_TIMELINE=DYNAMIC`` with
``hvd.start_timeline``, and ``hvd.shutdown()`` of ``HOROVOD_TIMELINE=<file>``); then it
initialises Horovod as the conftest did, for the tests that follow.
"""

import json
import os
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mpi4py import MPI

import hvdx
import hvdx.torch as hvd

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the timeline: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.decentralized, pytest.mark.stanza]

COMM = MPI.COMM_WORLD
STEPS = 3


class Net(nn.Module):
    """A weight TopK compresses and a bias Horovod allreduces (below ``min_size``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc(x)


def train(sync=None, compression=None, steps=STEPS):
    torch.manual_seed(hvd.rank())
    model = Net()
    kwargs = {"sync": sync} if sync is not None else {"compression": compression}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
        F.cross_entropy(model(x), y).backward()
        opt.step()


def train_stanza(steps=STEPS):
    """Stanza, the last rank the FC worker: rank 0, a conv worker, waits for its
    activation gradients each step."""
    torch.manual_seed(0)
    features, head = nn.Sequential(nn.Linear(64, 16), nn.ReLU()), nn.Linear(16, 4)
    opt = torch.optim.SGD(list(features.parameters()) + list(head.parameters()), lr=0.1)
    trainer = hvd.Stanza(features, head, opt, fc_workers=1)
    for _ in range(steps):
        if trainer.role == "conv":
            trainer.step(torch.randn(8, 64), torch.randint(0, 4, (8,)))
        else:
            trainer.step()


def train_both():
    train(compression=hvd.Compression.topk(0.1, 0.1, min_size=16))
    train(sync=hvdx.Decentralized("one-peer-exp"))
    train_stanza()


def now_us():
    return time.time_ns() // 1000


def check(path, began, ended):
    """Rank 0's file: Horovod's JSON with its allreduces, and hvdx's exchanges, every
    hvdx event inside [began, ended] on the timeline's clock."""
    with open(path) as f:
        events = json.load(f)
    start = events[0]["args"]["start_time_since_epoch_in_micros"]
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("name") == "process_name"}
    horovod = [e for e in events if e.get("ph") in "BX" and
               not names[e["pid"]].startswith("hvdx: ")]
    assert any(e["name"] == "ALLREDUCE" for e in horovod), sorted(names.values())
    ours = [e for e in events if e.get("ph") == "X" and names[e["pid"]].startswith("hvdx: ")]
    exchanges = {(names[e["pid"]], e["name"]) for e in ours}
    # TopK's pairs (an allgather or, sharded, an alltoall) and its NaN/Inf agreement.
    assert {"HVDX_TOPK_FINITE_CHECK", "HVDX_TOPK_ALLGATHER"} <= \
        {e for row, e in exchanges if row == "hvdx: topk"} or \
        {"HVDX_TOPK_FINITE_CHECK", "HVDX_TOPK_ALLTOALL", "HVDX_TOPK_SHARD_ALLGATHER"} <= \
        {e for row, e in exchanges if row == "hvdx: topk"}, exchanges
    assert ("hvdx: neighbors float32", "HVDX_NEIGHBOR_EXCHANGE") in exchanges, exchanges
    assert ("hvdx: stanza conv", "HVDX_STANZA_WAIT") in exchanges, exchanges
    assert min(p for p in names if names[p].startswith("hvdx: ")) > \
        max(p for p in names if not names[p].startswith("hvdx: "))
    slack = 1000  # the timeline's start is rounded to microseconds by two clocks
    for e in ours:
        assert began - start - slack <= e["ts"] <= e["ts"] + e["dur"] <= \
            ended - start + slack, (e, began - start, ended - start)
        if e["name"] == "HVDX_STANZA_SENDS":  # its sends' completion: nothing arrives
            assert e["args"]["bytes_received"] == 0, e
        elif names[e["pid"]].startswith("hvdx: stanza"):  # waits: what arrived
            assert e["args"]["bytes_received"] > 0, e
        else:
            assert e["args"]["bytes_sent"] > 0 and e["args"]["bytes_received"] > 0, e


def reinit(timeline):
    hvd.shutdown()
    os.environ["HOROVOD_TIMELINE"] = timeline
    hvd.init()


@pytest.mark.mpi(min_size=2)
def test_timeline_holds_horovods_ops_and_hvdxs_exchanges(tmp_path):
    rank = COMM.Get_rank()
    directory = COMM.bcast(str(tmp_path), root=0)  # only rank 0 writes the timeline
    dynamic, at_init = (os.path.join(directory, n) for n in ("dynamic.json", "init.json"))
    previous = os.environ.get("HOROVOD_TIMELINE")
    try:
        # 1. HOROVOD_TIMELINE=DYNAMIC, hvd.start_timeline / hvd.stop_timeline.
        reinit("DYNAMIC")
        began = now_us()
        hvd.start_timeline(dynamic)
        train_both()
        hvd.stop_timeline()
        ended = now_us()
        if rank == 0:
            check(dynamic, began, ended)
        # 2. HOROVOD_TIMELINE=<file>, closed by hvd.shutdown().
        began = now_us()
        reinit(at_init)
        train_both()
        hvd.shutdown()
        ended = now_us()
        if rank == 0:
            check(at_init, began, ended)
            # Written atomically: no temporary file left beside it.
            assert sorted(os.listdir(directory)) == ["dynamic.json", "init.json"]
    finally:
        if previous is None:
            os.environ.pop("HOROVOD_TIMELINE", None)
        else:
            os.environ["HOROVOD_TIMELINE"] = previous
        if hvd.is_initialized():
            hvd.shutdown()
        hvd.init()  # as the conftest did, for the tests that follow
