"""Horovod's timeline holds hvdx's TopK exchanges next to Horovod's allreduces
(TensorFlow's tape; the PyTorch test covers ``HOROVOD_TIMELINE=<file>`` and
decentralized SGD too).

``hvd.start_timeline`` needs ``HOROVOD_TIMELINE=DYNAMIC`` at ``hvd.init()``, and this
job's Horovod was initialised without it: the test shuts Horovod down, initialises it
again with it, records a few steps, and initialises Horovod as the conftest did for the
tests that follow.
"""

import json
import os
import time

import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx.tensorflow as hvd

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the timeline: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.decentralized]

COMM = MPI.COMM_WORLD


def topk_steps(steps=3):
    variables = [tf.Variable(tf.zeros(3000), name="w"), tf.Variable(tf.zeros(8), name="b")]
    for step in range(steps):
        grads = [tf.random.stateless_normal(v.shape, seed=(hvd.rank(), step))
                 for v in variables]
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(w * g) for w, g in zip(variables, grads)])
        tape = hvd.DistributedGradientTape(
            tape, compression=hvd.Compression.topk(0.02, 0.01, min_size=100))
        tape.gradient(loss, variables)


@pytest.mark.mpi(min_size=2)
def test_timeline_holds_horovods_allreduce_and_hvdxs_topk_exchange(tmp_path):
    path = COMM.bcast(str(tmp_path / "timeline.json"), root=0)  # rank 0 writes it
    previous = os.environ.get("HOROVOD_TIMELINE")
    try:
        hvd.shutdown()
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
        hvd.init()
        began = time.time_ns() // 1000
        hvd.start_timeline(path)
        topk_steps()
        hvd.stop_timeline()
        ended = time.time_ns() // 1000
    finally:
        if previous is None:
            os.environ.pop("HOROVOD_TIMELINE", None)
        else:
            os.environ["HOROVOD_TIMELINE"] = previous
        if hvd.is_initialized():
            hvd.shutdown()
        hvd.init()  # as the conftest did, for the tests that follow
    if COMM.Get_rank() != 0:
        return
    with open(path) as f:
        events = json.load(f)
    start = events[0]["args"]["start_time_since_epoch_in_micros"]
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("name") == "process_name"}
    assert any(e.get("name") == "ALLREDUCE" and not names[e["pid"]].startswith("hvdx: ")
               for e in events), sorted(names.values())
    ours = [e for e in events if e.get("ph") == "X" and names[e["pid"]] == "hvdx: topk"]
    assert {"HVDX_TOPK_FINITE_CHECK"} < {e["name"] for e in ours}, ours
    for e in ours:
        assert began - start - 1000 <= e["ts"] <= e["ts"] + e["dur"] <= ended - start + 1000
