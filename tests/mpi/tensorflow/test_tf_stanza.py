"""Stanza for TensorFlow: conv workers train the features, FC workers the head, and
together they train exactly what one process would on the concatenated global batch.

Every expectation is computed here: the reference is plain Keras SGD under a
``tf.GradientTape`` on rank 0's initial model and the whole global batch (every rank
rebuilds every batch from a seed), the roles and byte counts are written out from the
definition (the last F ranks are FC workers; conv worker i of S takes samples
[i B // S, (i + 1) B // S) of each global batch, so that F = 1 and F = 2 train on the
same batches). float64, no dropout or batch-norm. Stanza needs two ranks: at n = 1 only
the bad-input tests run. Tiny models and few steps: TensorFlow's eager overhead per
call dominates on two cores, so at 4 ranks only the variants that need more than two
ranks (two FC workers, three conv workers) run, besides the cheap bad-input tests.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx.tensorflow as hvd

pytestmark = [pytest.mark.stanza]

LR = 0.5
STEPS = 3
RTOL = 1e-5  # algorithms.md, section 4
ATOL = 1e-12
ACTIVATION = 6  # features' output per sample (the head's input)
CLASSES = 3
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SMALL_WORLD = MPI.COMM_WORLD.Get_size() <= 2
#: At 4 ranks, skip what 2 ranks already showed (module docstring).
ALSO_AT_TWO = pytest.mark.skipif(not SMALL_WORLD, reason="shown at 2 ranks; kept short at 4")


# --- models, data and the single-process reference ---------------------------------------

def dense(units, seed, activation=None, **kwargs):
    return tf.keras.layers.Dense(
        units, activation=activation, dtype="float64",
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed),
        bias_initializer=tf.keras.initializers.RandomNormal(stddev=0.1, seed=seed + 1),
        **kwargs)


def feature_layers(kind, seed):
    if kind == "mlp":
        return [dense(8, seed, "tanh", input_shape=(5,)), dense(ACTIVATION, seed + 2, "tanh")]
    conv = tf.keras.layers.Conv2D(
        2, 3, activation="tanh", dtype="float64", input_shape=(5, 5, 1),
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed))
    return [conv, tf.keras.layers.Flatten(dtype="float64"), dense(ACTIVATION, seed + 2, "tanh")]


def features_and_head(kind="mlp", seed=0):
    """The model of rank ``seed``'s choice: ``seed=0`` is rank 0's, the one trained."""
    seed = 10 * seed
    features = tf.keras.Sequential(feature_layers(kind, seed))
    head = dense(CLASSES, seed + 5)
    head.build((None, ACTIVATION))
    return features, head


def global_batch(step, kind="mlp"):
    """Step ``step``'s global batch: 9 or 11 samples, so that shares are uneven."""
    rng = np.random.default_rng(100 + step)
    size = 9 + 2 * (step % 2)
    shape = (5,) if kind == "mlp" else (5, 5, 1)
    return rng.standard_normal((size,) + shape), rng.integers(0, CLASSES, size)


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


def values(layer):
    return [v.numpy().copy() for v in layer.weights]


@functools.lru_cache(maxsize=None)
def reference(steps=STEPS, kind="mlp", momentum=0.0):
    """Single-process SGD on the global batches: ``(features, head)`` weights after
    each step (computed once per process; read only)."""
    features, head = features_and_head(kind, seed=0)
    variables = features.trainable_variables + head.trainable_variables
    opt = tf.keras.optimizers.SGD(LR, momentum=momentum)
    history = []
    for step in range(steps):
        x, y = global_batch(step, kind)
        with tf.GradientTape() as tape:
            loss = LOSS(y, head(features(x)))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        history.append((values(features), values(head)))
    return history


def build(kind="mlp", fc_workers=1, momentum=0.0, seed=None, micro_batches=1):
    """A trainer on this rank's own initial weights (rank 0's are broadcast)."""
    features, head = features_and_head(kind, hvd.rank() if seed is None else seed)
    opt = tf.keras.optimizers.SGD(LR, momentum=momentum)
    return hvd.Stanza(features, head, opt, fc_workers=fc_workers,
                      micro_batches=micro_batches), features, head


def train(trainer, steps, fc_workers=1, kind="mlp"):
    for step in steps:
        trainer.step(*share(step, fc_workers, kind))


def mine(trainer, features, head):
    """The part this rank trains and its index in the reference's pair."""
    return (1, head) if trainer.role == "fc" else (0, features)


def assert_close(layer, expected, rtol=RTOL, atol=ATOL):
    assert len(layer.weights) == len(expected)
    for v, value in zip(layer.weights, expected):
        np.testing.assert_allclose(v.numpy(), value, rtol=rtol, atol=atol, err_msg=v.name)


def everyone(value):
    return MPI.COMM_WORLD.allgather(value)


# --- equal to single-process SGD ------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["mlp", pytest.param("conv", marks=ALSO_AT_TWO)])
def test_parameters_after_every_step_equal_single_process_sgd_on_the_global_batch(kind):
    expected = reference(kind=kind)
    trainer, features, head = build(kind)
    assert trainer.role == ("fc" if is_fc(1) else "conv")
    part, layer = mine(trainer, features, head)
    for step in range(STEPS):
        train(trainer, [step], kind=kind)
        assert_close(layer, expected[step][part])


@pytest.mark.mpi(min_size=2)
@ALSO_AT_TWO
def test_momentum_sgd_equals_single_process_momentum_sgd():
    expected = reference(momentum=0.9)
    trainer, features, head = build(momentum=0.9)
    part, layer = mine(trainer, features, head)
    for step in range(STEPS):
        train(trainer, [step])
        assert_close(layer, expected[step][part])


@pytest.mark.mpi(min_size=4)
def test_two_fc_workers_train_the_same_model_as_one():
    models = []
    for fc_workers in (1, 2):
        trainer, _, _ = build(fc_workers=fc_workers)
        train(trainer, range(STEPS), fc_workers)
        models.append(trainer.full_model(rank=0))
    if hvd.rank() != 0:
        assert models == [None, None]
        return
    one, two = (m.get_weights() for m in models)
    for a, b in zip(one, two):
        # Only the summation order differs.
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=ATOL)
    features, head = reference()[-1]
    assert_close(models[1].layers[0], features)
    assert_close(models[1].layers[1], head)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fc_workers", [pytest.param(1, marks=ALSO_AT_TWO), 2])
def test_replicas_of_each_role_are_identical_after_every_step(fc_workers):
    if fc_workers > hvd.size() // 2:
        pytest.skip(f"fc_workers={fc_workers} needs {2 * fc_workers} ranks")
    trainer, features, head = build(fc_workers=fc_workers)
    for step in range(STEPS):
        train(trainer, [step], fc_workers)
        states = everyone((trainer.role, values(mine(trainer, features, head)[1])))
        for role in ("conv", "fc"):
            replicas = [state for r, state in states if r == role]
            for other in replicas[1:]:
                for i, (a, b) in enumerate(zip(replicas[0], other)):
                    assert np.array_equal(a, b), f"{role} variable {i}, step {step}"


# --- variables without a gradient ----------------------------------------------------------

class Gated(tf.keras.layers.Layer):
    """``base(x)``, plus ``branch(x)`` on even steps only and ``rare(x)`` only for the
    samples whose last input is positive (none, or one sample of the batch): variables
    that get no gradient in some steps on every rank of a role, or on some of them."""

    def __init__(self, units, seed, **kwargs):
        super().__init__(dtype="float64", **kwargs)
        self.base = dense(units, seed)
        self.branch = dense(units, seed + 2)
        self.rare = dense(units, seed + 4)
        self.even = True

    def build(self, input_shape):
        for layer in (self.base, self.branch, self.rare):
            layer.build(input_shape)
        super().build(input_shape)

    def call(self, x):
        out = self.base(x)
        if self.even:
            out = out + self.branch(x)
        marked = x[:, -1:] > 0
        if tf.reduce_any(marked):  # untaken, the branch leaves its gradients None
            out = out + tf.where(marked, self.rare(x), tf.zeros_like(out))
        return out


class GatedFeatures(tf.keras.layers.Layer):
    def __init__(self, seed, **kwargs):
        super().__init__(dtype="float64", **kwargs)
        self.gated = Gated(ACTIVATION, seed)

    def build(self, input_shape):
        self.gated.build(input_shape)
        super().build(input_shape)

    def call(self, x):
        # The mark travels on as the last activation, for the head's rare branch.
        return tf.concat([tf.tanh(self.gated(x)), x[:, -1:]], axis=1)


def gated_model(seed=0):
    features, head = GatedFeatures(20 * seed), Gated(CLASSES, 20 * seed + 10)
    features.build((None, 5))
    head.build((None, ACTIVATION + 1))
    return features, head


def gated_batch(step):
    """``global_batch``, its last input marking the first sample on odd steps only (it
    falls to conv worker 0, and to that worker's FC worker)."""
    x, y = global_batch(step)
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


def gated_optimizer():
    return tf.keras.optimizers.SGD(LR, momentum=0.9, weight_decay=1e-2)


@functools.lru_cache(maxsize=None)
def gated_reference(zero_missing=False):
    """Plain Keras on the global batches, ``None`` gradients left out of
    ``apply_gradients``; ``zero_missing``: the defect to catch, a zero gradient for
    every variable that got none."""
    features, head = gated_model()
    variables = features.trainable_variables + head.trainable_variables
    opt = gated_optimizer()
    opt.build(variables)  # Keras' way when a step may update only some of them
    history = []
    for step in range(STEPS):
        take_branches(step, features, head)
        x, y = gated_batch(step)
        with tf.GradientTape() as tape:
            loss = LOSS(y, head(features(x)))
        gradients = tape.gradient(loss, variables)
        if zero_missing:
            gradients = [tf.zeros_like(v) if g is None else g
                         for g, v in zip(gradients, variables)]
        opt.apply_gradients([(g, v) for g, v in zip(gradients, variables) if g is not None])
        history.append((values(features), values(head)))
    return history


def relative_distance(a, b):
    """``max |a - b| / max |b|`` over two lists of weights."""
    return max(np.abs(u - v).max() / np.abs(v).max() for u, v in zip(a, b))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("fc_workers", [1, 2])
def test_variables_without_a_gradient_are_left_out_on_their_role_and_not_moved(fc_workers):
    # At 2 ranks each role has one rank; at 4 a role has several: three conv workers
    # (F = 1), two of each (F = 2). Branch: no gradient on any rank on odd steps. Rare:
    # on odd steps a gradient on conv worker 0 and its FC worker only, none anywhere on
    # even ones.
    if fc_workers > hvd.size() // 2:
        pytest.skip(f"fc_workers={fc_workers} needs {2 * fc_workers} ranks")
    expected, zeroed = gated_reference(), gated_reference(zero_missing=True)
    for part in (0, 1):
        # Zero gradients let momentum and weight decay move them: far outside tolerance.
        assert relative_distance(zeroed[-1][part], expected[-1][part]) > 1000 * RTOL

    features, head = gated_model(seed=hvd.rank())
    trainer = hvd.Stanza(features, head, gated_optimizer(), fc_workers=fc_workers)
    part, layer = mine(trainer, features, head)
    for step in range(STEPS):
        take_branches(step, features, head)
        before = values(layer)
        trainer.step(*gated_share(step, fc_workers))
        assert_close(layer, expected[step][part])
        gated = layer if part == 1 else layer.gated
        untaken = gated.branch if step % 2 else gated.rare  # by no rank of either role
        kept = {v.ref() for v in untaken.weights}
        for v, old in zip(layer.weights, before):
            # Bitwise: neither momentum nor weight decay touched it; all else moved.
            assert np.array_equal(v.numpy(), old) == (v.ref() in kept), (v.name, step)
        states = everyone((trainer.role, values(layer)))
        replicas = [state for role, state in states if role == trainer.role]
        for other in replicas[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(replicas[0], other)), step


# --- what travels ------------------------------------------------------------------------

def parameter_bytes(layer):
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in layer.trainable_variables)


def summed_bytes(layer):
    """A role's allreduce: its gradients and one presence flag per variable (float64)."""
    return parameter_bytes(layer) + 8 * len(layer.trainable_variables)


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
@ALSO_AT_TWO
@pytest.mark.parametrize("target", ["rank 0", "last rank (an FC worker)"])
def test_full_model_is_single_process_sgds_model_with_the_original_layer_names(target):
    n = hvd.size()
    rank = 0 if target == "rank 0" else n - 1
    features, head = features_and_head(seed=hvd.rank())
    model = tf.keras.Sequential(features.layers + [head])
    opt = tf.keras.optimizers.SGD(LR)
    trainer = hvd.Stanza(model, split=2, optimizer=opt)
    train(trainer, range(STEPS))
    full = trainer.full_model(rank=rank)
    if hvd.rank() != rank:
        assert full is None
        return
    assert [layer.name for layer in full.layers] == [layer.name for layer in model.layers]
    expected_features, expected_head = reference()[-1]
    expected = expected_features[:2], expected_features[2:], expected_head
    for layer, weights in zip(full.layers, expected):
        assert_close(layer, weights)
    x, _ = global_batch(0)
    assert full(x).shape == (len(x), CLASSES)
    assert full.layers[0] is not model.layers[0]  # a copy: training on does not change it


@pytest.mark.mpi(min_size=2)
@ALSO_AT_TWO
def test_resuming_from_a_checkpoint_is_bitwise_an_uninterrupted_run(tmp_path):
    stop = 2
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "stanza.hvdx"), root=0)
    straight, features, head = build(momentum=0.9)
    train(straight, range(STEPS))
    uninterrupted = values(mine(straight, features, head)[1])

    first, _, _ = build(momentum=0.9)
    train(first, range(stop))
    hvd.save_checkpoint(path, stanza=first.state())
    resumed, features, head = build(momentum=0.9, seed=hvd.rank() + 7)  # other weights
    hvd.load_checkpoint(path, stanza=resumed.state())
    assert resumed.steps == stop
    train(resumed, range(stop, STEPS))
    for a, b in zip(values(mine(resumed, features, head)[1]), uninterrupted):
        assert np.array_equal(a, b)
    a, b = straight.full_model(0), resumed.full_model(0)
    if hvd.rank() == 0:
        assert all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))


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
def test_a_head_without_trainable_variables_fails_on_every_rank():
    features, _ = features_and_head()
    flatten = tf.keras.layers.Flatten()
    flatten.build((None, ACTIVATION))
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, flatten, tf.keras.optimizers.SGD(LR))
    assert "head (Flatten) has no trainable variables" in the_same_everywhere(error)


@pytest.mark.mpi(min_size=1)
def test_a_model_without_variables_yet_fails_on_every_rank_saying_how_to_build_it():
    features = tf.keras.Sequential([dense(8, 0, "tanh"), dense(ACTIVATION, 2, "tanh")])
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, dense(CLASSES, 5), tf.keras.optimizers.SGD(LR))
    message = the_same_everywhere(error)
    assert "features (Sequential) and head (Dense) not built" in message
    assert "call it once" in message and "example=" in message


@pytest.mark.mpi(min_size=2)
@ALSO_AT_TWO
def test_example_builds_a_model_without_variables_and_it_trains_as_one_process():
    seed = 10 * hvd.rank()  # features_and_head's layers, built by the example
    features = tf.keras.Sequential([dense(8, seed, "tanh"), dense(ACTIVATION, seed + 2, "tanh")])
    head = dense(CLASSES, seed + 5)
    trainer = hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR),
                         example=global_batch(0)[0][:2])
    part, layer = mine(trainer, features, head)
    expected = reference(steps=1)
    train(trainer, [0])
    assert_close(layer, expected[0][part])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("difference", ["fc_workers", "head"])
def test_one_rank_with_another_model_or_fc_workers_fails_on_every_rank(difference):
    last = hvd.rank() == hvd.size() - 1
    if difference == "fc_workers":
        with pytest.raises(ValueError) as error:
            build(fc_workers=2 if last else 1)
        assert "fc_workers" in the_same_everywhere(error)
        return
    features, head = features_and_head()
    if last:
        head = dense(CLASSES + 1, 5)
        head.build((None, ACTIVATION))
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR))
    message = the_same_everywhere(error)
    assert "ranks disagree" in message and "head[0]" in message


@pytest.mark.mpi(min_size=2)
def test_features_that_do_not_fit_the_head_fail_every_rank_at_the_first_step():
    features, _ = features_and_head()
    head = dense(CLASSES, 5)
    head.build((None, ACTIVATION - 1))  # takes 5 features, gets 6
    trainer = hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR))
    with pytest.raises(ValueError) as error:
        trainer.step(*share(0, 1))
    message = the_same_everywhere(error)
    assert "per sample [6]" in message and "axis -1 of size 5" in message
    assert trainer.stats.last_received["activation_gradients"] == 0
    everyone(None)  # every rank is back in step: a collective completes


@pytest.mark.mpi(min_size=2)
def test_with_an_example_a_head_that_does_not_fit_fails_at_construction_naming_both_shapes():
    features, _ = features_and_head()
    head = dense(CLASSES, 5)
    head.build((None, ACTIVATION - 1))  # takes 5 features, gets 6
    with pytest.raises(ValueError) as error:
        hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR), example=global_batch(0)[0][:3])
    message = the_same_everywhere(error)
    assert f"activations of shape (3, {ACTIVATION})" in message
    assert f"to have value {ACTIVATION - 1}" in message  # what the head takes (Keras)
    everyone(None)


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
    trainer, _, _ = build()
    x, y = share(0, 1)
    if hvd.rank() == 1 and fault == "features fail":
        x = np.zeros((len(y), 7))  # 7 inputs, the first layer takes 5
    if hvd.rank() == 1 and fault == "labels differ":
        y = y.astype(np.int32)
    with pytest.raises(ValueError) as error:
        trainer.step(x, y)
    message = the_same_everywhere(error)
    if fault == "features fail":
        assert "rank 1: features(x) raised ValueError" in message
    else:
        assert ("the conv workers' batches differ: rank 0's gives activations [*, 6] "
                "float64, labels [*] int64, rank 1's gives activations [*, 6] "
                "float64, labels [*] int32") in message


@pytest.mark.mpi(min_size=2)
@ALSO_AT_TWO
def test_after_a_first_step_that_failed_everywhere_the_next_one_checks_again_and_trains():
    # Labels out of range on rank 0: the loss fails on the FC worker, every rank raises,
    # nothing is applied; the next step agrees on the data again and training proceeds
    # as if the failed step had not been taken.
    expected = reference(steps=2)
    trainer, features, head = build()
    x, y = share(0, 1)
    with pytest.raises(ValueError) as error:
        trainer.step(x, y + CLASSES if hvd.rank() == 0 else y)
    assert "loss_fn cannot take the head's output" in the_same_everywhere(error)
    assert trainer.stats.steps == 0
    part, layer = mine(trainer, features, head)
    for step in range(2):
        train(trainer, [step])
        assert_close(layer, expected[step][part])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("saved", ["another layout",
                                   pytest.param("another model", marks=ALSO_AT_TWO)])
def test_a_checkpoint_of_another_layout_or_model_fails_on_every_rank_and_loads_nothing(
        saved, tmp_path):
    if saved == "another layout" and hvd.size() < 4:
        pytest.skip("two layouts of one world (fc_workers 1 and 2) need four ranks")
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "stanza.hvdx"), root=0)
    if saved == "another layout":
        other, _, _ = build(fc_workers=2)
    else:
        features = tf.keras.Sequential([dense(8, 0, "tanh", input_shape=(5,)),
                                        dense(ACTIVATION + 1, 2, "tanh")])
        head = dense(CLASSES, 5)
        head.build((None, ACTIVATION + 1))
        other = hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR))
    hvd.save_checkpoint(path, stanza=other.state())
    trainer, features, head = build()
    train(trainer, range(1))
    _, layer = mine(trainer, features, head)
    before = values(layer)
    with pytest.raises(ValueError) as error:
        hvd.load_checkpoint(path, stanza=trainer.state())
    message = the_same_everywhere(error)
    if saved == "another layout":
        assert "rank 0's state was saved as a conv worker (rank 0)" in message
        assert "fc_workers=2" in message and "fc_workers=1" in message
    else:
        assert "rank 0's module variable 2" in message and "(8, 7)" in message
    assert all(np.array_equal(a, b) for a, b in zip(values(layer), before))
    assert trainer.steps == 1
    everyone(None)  # every rank is back in step: a collective completes


@pytest.mark.mpi(min_size=2)
def test_full_model_for_a_rank_outside_the_job_fails_on_every_rank():
    trainer, _, _ = build()
    with pytest.raises(ValueError) as error:
        trainer.full_model(rank=hvd.size())
    assert f"rank={hvd.size()} is not a rank" in the_same_everywhere(error)
    everyone(None)


# --- fc_workers="auto" ----------------------------------------------------------------------

def build_auto(features, head, example):
    return hvd.Stanza(features, head, tf.keras.optimizers.SGD(LR), fc_workers="auto",
                      example=example)


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
    assert 1 <= trainer.roles.fc_workers <= n // 2
    assert probe["fc_workers"] == trainer.roles.fc_workers == expected
    # The probe changed no variable: training from here is single-process SGD.
    fc_workers = trainer.roles.fc_workers
    part, layer = mine(trainer, features, head)
    reference_states = reference(steps=2)
    for step in range(2):
        trainer.step(*share(step, fc_workers))
        assert_close(layer, reference_states[step][part])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("example", ["none", "wrong shape"])
def test_auto_without_a_fitting_example_fails_on_every_rank(example):
    if example == "wrong shape" and hvd.size() < 2:
        pytest.skip("alone, Stanza refuses the world size before it probes")
    features, head = features_and_head()
    example = None if example == "none" else np.zeros((4, 7))
    with pytest.raises(ValueError) as error:
        build_auto(features, head, example)
    message = the_same_everywhere(error)
    if example is None:
        assert "fc_workers='auto'" in message and "pass example=" in message
    else:
        assert "example= (" in message and "does not go through the features" in message
    everyone(None)


# --- micro-batches ---------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("micro_batches", [2, 5])
def test_micro_batches_train_the_same_model_as_single_process_sgd(micro_batches):
    # 5 parts of a conv worker's 3 to 6 samples: some parts are empty.
    fc_workers = 2 if hvd.size() >= 4 else 1
    expected = reference(kind="conv", momentum=0.9)
    trainer, features, head = build("conv", fc_workers, momentum=0.9,
                                    micro_batches=micro_batches)
    part, layer = mine(trainer, features, head)
    for step in range(STEPS):
        trainer.step(*share(step, fc_workers, "conv"))
        assert_close(layer, expected[step][part])


@pytest.mark.mpi(min_size=2)
def test_micro_batches_give_the_losses_and_weights_of_one_batch_up_to_rounding():
    fc_workers = 2 if hvd.size() >= 4 else 1
    runs = []
    for micro_batches in (1, 3):
        trainer, features, head = build(fc_workers=fc_workers, micro_batches=micro_batches)
        losses = [trainer.step(*share(step, fc_workers)) for step in range(STEPS)]
        runs.append((losses, values(mine(trainer, features, head)[1])))
    (losses, weights), (split_losses, split_weights) = runs
    np.testing.assert_allclose(split_losses, losses, rtol=1e-12)
    for a, b in zip(weights, split_weights):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=ATOL)


@pytest.mark.mpi(min_size=2)
@ALSO_AT_TWO
def test_micro_batches_move_the_same_activations_plus_one_batch_size_per_conv_worker():
    trainer, _, _ = build(micro_batches=3)
    x, y = share(0, 1)
    loss = trainer.step(x, y)
    sent, received = trainer.stats.last_sent, trainer.stats.last_received
    s = conv_workers(1)
    item = 8  # float64 activations, int64 labels
    if trainer.role == "conv":
        assert sent["activations"] == len(y) * (ACTIVATION + 1) * item
        assert received["activation_gradients"] == len(y) * ACTIVATION * item
        # Its batch size, and one loss per part.
        assert sent["control"] == 8 and received["control"] == 3 * 8
        # The loss is the mean over its samples, as without micro-batches.
        features, head = features_and_head(seed=0)
        np.testing.assert_allclose(loss, LOSS(y, head(features(x))).numpy(), rtol=1e-12)
    else:
        assert received["activations"] == len(global_batch(0)[1]) * (ACTIVATION + 1) * item
        assert received["control"] == 8 * s and sent["control"] == 3 * 8 * s


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("micro_batches", [0, 1.5, True])
def test_bad_micro_batches_fail_on_every_rank(micro_batches):
    with pytest.raises(ValueError) as error:
        build(micro_batches=micro_batches)
    message = the_same_everywhere(error)
    assert f"micro_batches={micro_batches!r} must be an integer of at least 1" in message
