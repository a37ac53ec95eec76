"""A wrong value on one rank only fails on every rank, with the same message, no hang
(TensorFlow: the tape and the Keras optimizer).

Rank 1 gets the wrong value, the others a valid one. A synchronization strategy is
checked across ranks when the tape or optimizer is built; a compression strategy, like
Horovod's own tape, when it first sees its variables (the first ``gradient`` or
``apply_gradients``), so the error surfaces there, on every rank. A Horovod allreduce
afterwards shows that no rank was left inside a collective.
"""

import pytest
import tensorflow as tf

import hvdx
import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras
from hvdx.strategies.topk.spec import TopKCompression
from mpi4py import MPI

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="a wrong value on one rank: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

#: name -> (valid spec, wrong spec on rank 1, text the message must hold).
SPECS = {
    "topk ratio": (lambda: hvd.Compression.topk(0.5), lambda: hvd.Compression.topk(2.0),
                   "ratio=2.0"),
    "topk selection": (lambda: hvd.Compression.topk(0.5),
                       lambda: hvd.Compression.topk(0.5, selection="best"),
                       "selection='best'"),
    "dssync schedule": (lambda: hvdx.DSSync(), lambda: hvdx.DSSync("shuffled"),
                        "schedule='shuffled'"),
    "dssync swa_every": (lambda: hvdx.DSSync("shuffle", group_size=2),
                         lambda: hvdx.DSSync("shuffle", group_size=2, swa_every=3),
                         "swa_every=3"),
    "decentralized order": (lambda: hvdx.Decentralized(),
                            lambda: hvdx.Decentralized(order="both"), "order='both'"),
}


def one_step(entry, spec=None, **arguments):
    """Build the entry with ``spec`` and take one step on ``0.5 |x|^2``."""
    if spec is not None:
        arguments["compression" if isinstance(spec, TopKCompression) else "sync"] = spec
    x = tf.Variable(tf.ones([2048]))  # above TopK's min_size: really compressed
    optimizer = tf.keras.optimizers.SGD(0.1)
    if entry == "keras":
        # minimize: Horovod's Keras optimizer synchronizes in compute_gradients.
        optimizer = hvd_keras.DistributedOptimizer(optimizer, **arguments)
        optimizer.minimize(lambda: 0.5 * tf.reduce_sum(x ** 2), [x])
        return
    with tf.GradientTape() as tape:
        loss = 0.5 * tf.reduce_sum(x ** 2)
    tape = hvd.DistributedGradientTape(tape, **arguments)
    grads = tape.gradient(loss, [x])
    optimizer.apply_gradients(zip(grads, [x]))


def the_same_everywhere(message):
    return len(set(hvd.allgather_object(message))) == 1


def nobody_waits(name):
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.{name}")
    return total.numpy().tolist() == [float(hvd.size())] * 2


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_wrong_on_one_rank_fails_on_every_rank(name, entry):
    valid, wrong, text = SPECS[name]
    spec = wrong() if hvd.rank() == 1 else valid()
    with pytest.raises(ValueError) as info:
        one_step(entry, spec)
    message = str(info.value)
    assert "rank 1" in message and text in message
    assert the_same_everywhere(message)
    assert nobody_waits(f"{name}.{entry}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_wrong_on_every_rank_raises_its_own_message(name, entry):
    _, wrong, text = SPECS[name]
    spec = wrong()
    with pytest.raises(ValueError, match=text) as info:
        one_step(entry, spec)
    assert info.value is spec.error
    assert nobody_waits(f"all.{name}.{entry}")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_alone_the_constructor_raises_at_once(name):
    if hvd.size() > 1:
        pytest.skip("a job of one rank")
    with pytest.raises(ValueError, match=SPECS[name][2]):
        SPECS[name][1]()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_an_op_topk_cannot_honour_on_one_rank_fails_every_rank(entry):
    op = hvd.Adasum if hvd.rank() == 1 else hvd.Average
    with pytest.raises(ValueError) as info:
        one_step(entry, hvd.Compression.topk(0.5), op=op)
    message = str(info.value)
    assert "rank 1" in message and "op=Adasum" in message
    assert the_same_everywhere(message)
    assert nobody_waits(f"op.{entry}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape", "keras"])
def test_a_sync_of_the_wrong_type_on_one_rank_fails_every_rank(entry):
    sync = "dssync" if hvd.rank() == 1 else hvdx.Decentralized()
    with pytest.raises((TypeError, ValueError)) as info:
        one_step(entry, sync=sync)
    message = str(info.value)
    assert "rank 1" in message and "sync='dssync'" in message
    assert the_same_everywhere(message)
    assert nobody_waits(f"sync.type.{entry}")
