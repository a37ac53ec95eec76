"""Horovod's Keras recipes under every strategy, chosen by the environment as a user's
unchanged Horovod script would have it: ``fit`` with Horovod's callbacks, and the
resume recipe in which rank 0 alone loads the saved model with ``hvd.load_model`` and
``BroadcastGlobalVariablesCallback`` gives every rank its variables.

The strategies run in this job (dynamic process sets, for DS-Sync's groups); the
reference is plain Horovod in the same test.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdx.tensorflow as hvd_tf
import hvdx.tensorflow.keras as hvd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402

ENVIRONMENT = {"horovod": {}, "topk": {"compression": "topk(0.1, 0.05, min_size=0)"},
               "dssync": {"sync": "DSSync()"}, "decentralized": {"sync": "Decentralized"}}
LR = 0.05

# What these recipes show does not depend on the size; at 4 ranks, on 2 cores, TensorFlow
# traces and runs them too slowly for the suite's budget.
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="Keras recipes: checked at 1 and 2 ranks"),
              pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]


def data():
    rng = np.random.default_rng(hvd.rank())
    return (rng.normal(size=(32, 5)).astype("float32"),
            rng.normal(size=(32, 2)).astype("float32"))


def compiled(seed):
    tf.random.set_seed(seed)
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh",
                                                       input_shape=(5,)),
                                 tf.keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR)),
                  loss="mse")
    return model


def weights(model):
    return np.concatenate([v.numpy().ravel() for v in model.trainable_variables])


def same_on_every_rank(array, atol):
    everyone = hvd_tf.allgather_object(array)
    return all(np.allclose(a, everyone[0], rtol=0, atol=atol) for a in everyone)


def one_model(strategy):
    """Whether the ranks must hold one model: always when gradients are averaged; under
    parameter mixing at 2 ranks, where a group or a peer is everyone."""
    return strategy in ("horovod", "topk") or hvd.size() <= 2


def assert_one_model_where_there_must_be_one(strategy, model):
    """Every rank's weights, gathered, bitwise alike where :func:`one_model` holds: a
    recipe that leaves the ranks apart must not pass as working."""
    if one_model(strategy):
        assert same_on_every_rank(weights(model), atol=0), \
            f"{strategy}: the ranks' weights differ"


def fit_with_callbacks(seed):
    """Two epochs of ``fit`` with Horovod's four callbacks; the history and the final
    learning rate. (``momentum_correction=False``: Horovod 0.28.1's callbacks cannot set
    the momentum of TensorFlow 2.11's optimizers, a float, under Horovod alone too.)"""
    x, y = data()
    model = compiled(seed)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=1,
                                                 momentum_correction=False, verbose=0),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=lambda _: 0.5,
                                                   start_epoch=1, momentum_correction=False),
    ]
    history = model.fit(x, y, batch_size=8, epochs=2, callbacks=callbacks, verbose=0)
    return model, history.history["loss"], float(model.optimizer.learning_rate.numpy())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", sorted(ENVIRONMENT))
def test_fit_with_horovods_callbacks_under_each_strategy(strategy):
    with hvdx_variables(**ENVIRONMENT[strategy]):
        model, losses, lr = fit_with_callbacks(seed=hvd.rank())
    # The warm-up ended at LR after the first epoch, and the schedule halved it for the
    # second (as under Horovod: the "horovod" case), and the averaged metric is the
    # same on every rank.
    assert lr == pytest.approx(LR * 0.5)
    assert same_on_every_rank(np.asarray(losses), atol=1e-6)
    assert_one_model_where_there_must_be_one(strategy, model)



@pytest.fixture
def fresh_keras_names():
    """Keras' layer-name counters at zero on every rank, before and after the test.

    Horovod's broadcasts of Keras variables (``BroadcastGlobalVariablesCallback``)
    match the ranks' tensors by the variables' names, so the ranks' models must be
    named alike; in Horovod's recipe each process builds one model, so they are. Here
    the job has built models before, and rank 0 loads one where the others build one,
    which moves the counters apart: a later broadcast would then wait forever, under
    plain Horovod too."""
    tf.keras.backend.clear_session()
    yield tf.keras.backend.clear_session
    tf.keras.backend.clear_session()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", sorted(ENVIRONMENT))
def test_rank0_loads_the_model_and_the_callback_broadcasts_it(strategy, tmp_path,
                                                              fresh_keras_names):
    x, y = data()
    path = hvd_tf.broadcast_object(str(tmp_path / "model.h5"), root_rank=0,
                                   name=f"model.path.{strategy}")
    with hvdx_variables(**ENVIRONMENT[strategy]):
        model = compiled(seed=0)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        if hvd.rank() == 0:
            model.save(path)
            saved = weights(model)
        hvd_tf.allgather_object(None)  # the file is written before anyone reads it
        # Horovod's resume recipe, as in a new process: rank 0 loads, the others build.
        fresh_keras_names()
        resumed = hvd.load_model(path) if hvd.rank() == 0 else compiled(seed=100)
        kinds = hvd_tf.allgather_object(
            (type(resumed.optimizer).__module__, hasattr(resumed.optimizer, "hvdx_stats")))
        assert len(set(kinds)) == 1, f"the loaded optimizer is another kind: {kinds}"
        if hvd.rank() == 0:
            np.testing.assert_array_equal(weights(resumed), saved)
        resumed.fit(x, y, batch_size=8, epochs=1, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_one_model_where_there_must_be_one(strategy, resumed)
    assert np.isfinite(weights(resumed)).all()

@pytest.mark.mpi(min_size=1)
def test_join_is_horovods_while_no_strategy_was_built(monkeypatch):
    import hvdx.tensorflow.join_guard as join_module

    monkeypatch.setattr(join_module, "_built", set())
    # Every rank joins at once: Horovod's join returns the rank that joined last.
    assert 0 <= int(hvd_tf.join()) < hvd_tf.size()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", ["topk", "dssync", "decentralized"])
def test_join_is_refused_once_a_strategy_was_built(strategy, monkeypatch):
    import hvdx.tensorflow.join_guard as join_module

    monkeypatch.setattr(join_module, "_built", set())
    with hvdx_variables(**ENVIRONMENT[strategy]):
        compiled(seed=0)
    # Every rank calls it here, so every rank sees the refusal; in a training loop the
    # one rank that ran out of data raises, and hvdx's abort ends the job.
    with pytest.raises(ValueError, match=rf"hvd.join\(\): not supported with hvdx's "
                                         rf"{strategy} strategy.*dataset.shard"):
        hvd_tf.join()


@pytest.mark.mpi(min_size=1)
def test_stanza_as_sync_of_the_tape_is_refused_on_every_rank_naming_the_trainer():
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    with pytest.raises(ValueError, match=r"sync=Stanza: Stanza is a trainer.*trainer.step"):
        hvd_tf.DistributedGradientTape(tape, sync=hvd_tf.Stanza).gradient(loss, [w])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("strategy", sorted(ENVIRONMENT))
def test_the_tape_recipe_broadcasts_the_model_and_optimizer_variables_after_step_one(
        strategy, fresh_keras_names):
    """Horovod's TF2 recipe: after the first step, ``hvd.broadcast_variables`` of the
    model's and then the optimizer's variables (momentum slots, the step counter) gives
    every rank rank 0's values; training then goes on. (The tape mixes before the
    update: decentralized SGD combine-then-adapt.)"""
    x, y = data()
    tape_environment = {**ENVIRONMENT, "decentralized": {
        "sync": "Decentralized(order='combine_then_adapt')"}}
    with hvdx_variables(**tape_environment[strategy]):
        tf.random.set_seed(hvd.rank())
        model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh",
                                                           input_shape=(5,)),
                                     tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.SGD(LR, momentum=0.9)
        for step in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x[8 * step:8 * step + 8]) -
                                       y[8 * step:8 * step + 8]) ** 2)
            tape = hvd_tf.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            if step == 0:
                roots = hvd_tf.broadcast_object(
                    [v.numpy() for v in model.variables + optimizer.variables()],
                    root_rank=0)
                hvd_tf.broadcast_variables(model.variables, root_rank=0)
                hvd_tf.broadcast_variables(optimizer.variables(), root_rank=0)
                mine = [v.numpy() for v in model.variables + optimizer.variables()]
                assert len(mine) == len(roots) > len(model.variables)
                for a, b in zip(mine, roots):
                    np.testing.assert_array_equal(a, b)
    # The tape mixes before the update (combine-then-adapt, both mixing strategies):
    # each rank's last local step is its own, so only gradient averaging keeps one model.
    if strategy in ("horovod", "topk"):
        assert_one_model_where_there_must_be_one(strategy, model)
    assert np.isfinite(weights(model)).all()
