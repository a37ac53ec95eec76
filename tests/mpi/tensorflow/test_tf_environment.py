"""TopK chosen by ``HVDX_COMPRESSION`` for an unchanged Horovod script (TensorFlow: the
tape and the Keras optimizer).

The variable is set on every rank inside the test (``hvdx_variables``) before the tape
or optimizer is built, as ``mpirun -genv`` would set it. The reference is the same
strategy passed in code, or Horovod's own tape and optimizer. A compression strategy is
checked across ranks when it first sees its variables, so errors surface at the first
step, on every rank.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import hvdx.tensorflow as hvd
import hvdx.tensorflow.keras as hvd_keras

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402
from mpi4py import MPI  # noqa: E402

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the environment switch: checked at 1 and 2 ranks"),
              pytest.mark.topk]

ENTRIES = ["tape", "keras"]


def trained(entry, steps=3, **arguments):
    """``x`` (2048 entries: above TopK's min_size) after ``steps`` eager steps of SGD on
    ``0.5 |x - c|^2``, ``c`` different on every rank; and the tape or Keras optimizer."""
    x = tf.Variable(tf.ones([2048]))
    centre = tf.constant(np.random.default_rng(hvd.rank()).standard_normal(2048),
                         tf.float32)
    optimizer = tf.keras.optimizers.SGD(0.1)
    if entry == "keras":
        optimizer = hvd_keras.DistributedOptimizer(optimizer, **arguments)
        owner = optimizer
    for _ in range(steps):
        if entry == "keras":
            optimizer.minimize(lambda: 0.5 * tf.reduce_sum((x - centre) ** 2), [x])
            continue
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_sum((x - centre) ** 2)
        owner = tape = hvd.DistributedGradientTape(tape, **arguments)
        optimizer.apply_gradients(zip(tape.gradient(loss, [x]), [x]))
    return x.numpy(), (owner if steps else None)


def refused_everywhere(entry, value, name, **arguments):
    """The ``ValueError`` of the first step, after checking that every rank raised the
    same message and that no rank was left in a collective."""
    with pytest.raises(ValueError) as info:
        with hvdx_variables(compression=value):
            trained(entry, steps=1, **arguments)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.{entry}.{name}")
    assert total.numpy().tolist() == [float(hvd.size())] * 2
    return message


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("value, in_code", [
    ("topk(0.1, 0.1)", lambda: hvd.Compression.topk(0.1, 0.1)),
    ("safe", lambda: hvd.Compression.topk(preset="safe")),
    # the old spelling of topk_method and small_tensors
    ("topk(0.1, 0.1, selector='threshold', small_tensors='hvdx')",
     lambda: hvd.Compression.topk(0.1, 0.1, topk_method="sampled_threshold",
                                  small_tensors="in_topk_step")),
])
def test_a_topk_from_the_environment_trains_bitwise_like_the_same_topk_in_code(
        entry, value, in_code):
    with hvdx_variables(compression=value):
        from_environment, _ = trained(entry)
    from_code, _ = trained(entry, compression=in_code())
    assert np.array_equal(from_environment, from_code)
    assert not np.array_equal(from_code, np.ones(2048))


@pytest.mark.mpi(min_size=1)
def test_the_presets_run_without_momentum_correction_in_tensorflow():
    expected = hvd.Compression.topk(0.01, 0.01, topk_method="sampled_threshold",
                                    selection="global", small_tensors="in_topk_step")
    assert hvd.Compression.topk(preset="fast") == expected
    assert hvd.Compression.topk(preset="safe") == hvd.Compression.topk(
        0.01, 0.02, topk_method="sampled_threshold", selection="global",
        small_tensors="in_topk_step")
    # The old names and values of topk_method and small_tensors build the same spec.
    assert expected == hvd.Compression.topk(0.01, 0.01, selector="threshold",
                                            selection="global", small_tensors="hvdx")
    # Given explicitly, it is kept (and refused by the tape, as always in TensorFlow).
    assert hvd.Compression.topk(preset="fast", momentum_correction=True,
                                momentum_masking=False).momentum_correction


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("value", [None, "none"])
def test_unset_or_none_is_horovods_own_tape_and_optimizer(entry, value):
    with hvdx_variables(compression=value, sync=value):
        _, owner = trained(entry, steps=1)
    assert type(owner).__module__.startswith("horovod.")


@pytest.mark.mpi(min_size=1)
def test_rank_zero_says_once_per_entry_point_which_topk_the_environment_chose(capsys):
    with hvdx_variables(compression="fast"):
        trained("tape")  # a tape per step: said once
        trained("keras")
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx] HVDX_COMPRESSION=")]
    if hvd.rank() > 0:
        assert said == []
        return
    assert [line.split(" (")[-1] for line in said] == [
        "DistributedGradientTape)", "keras DistributedOptimizer)"]
    assert all(line.startswith("[hvdx] HVDX_COMPRESSION='fast': bidirectional TopK, "
                               "ratio=0.01 downlink=0.01 ") for line in said)


@pytest.mark.mpi(min_size=1)
def test_rank_zero_says_once_per_entry_point_which_strategy_the_code_passes(capsys):
    spec = hvd.Compression.topk(0.1, 0.1)
    with hvdx_variables():  # (forgets what earlier tests said)
        trained("tape", compression=spec)  # a tape per step: said once
        trained("keras", compression=spec)
        trained("keras", compression=hvd.Compression.topk(0.1, 0.1))  # the same setting
    said = [line for line in capsys.readouterr().err.splitlines()
            if "compression in the code: " in line]
    if hvd.rank() > 0:
        assert said == []
        return
    assert [line.split(" (")[-1] for line in said] == [
        "DistributedGradientTape)", "keras DistributedOptimizer)"]
    assert all(line.startswith("[hvdx] compression in the code: bidirectional TopK, "
                               f"{spec.describe()[len('topk '):]} (") for line in said)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
def test_hvdx_log_level_warning_silences_what_runs(entry, capsys, monkeypatch):
    monkeypatch.setenv("HVDX_LOG_LEVEL", "warning")
    with hvdx_variables(compression="fast"):
        trained(entry, steps=1)
    with hvdx_variables():
        trained(entry, steps=1, compression=hvd.Compression.topk(0.1, 0.1))
    assert [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx")] == []


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_compression_in_the_code_wins_over_the_environment(entry):
    with hvdx_variables(compression="topk(0.5)"):
        from_environment, _ = trained(entry, compression=hvd.Compression.topk(0.1))
    from_code, _ = trained(entry, compression=hvd.Compression.topk(0.1))
    assert np.array_equal(from_environment, from_code)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_forbidden_expression_fails_every_rank_naming_the_variable(entry):
    value = "__import__('os').system('touch /tmp/hvdx-pwned')"
    message = refused_everywhere(entry, value, "forbidden")
    assert f"HVDX_COMPRESSION={value!r}" in message
    assert "neither a name nor a call" in message
    assert not pathlib.Path("/tmp/hvdx-pwned").exists()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_rank_launched_with_another_value_fails_every_rank(entry):
    message = refused_everywhere(entry, "topk(0.2)" if hvd.rank() == 1 else "topk(0.1)",
                                 "another")
    assert "setting 'HVDX_COMPRESSION' differs between ranks" in message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_value_unparsable_on_one_rank_only_fails_every_rank(entry):
    message = refused_everywhere(entry, "topk(0.1" if hvd.rank() == 1 else "topk(0.1)",
                                 "unparsable")
    assert "rank 1" in message and "HVDX_COMPRESSION='topk(0.1'" in message


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ENTRIES)
def test_topk_passed_without_calling_it_fails_every_rank_saying_to_call_it(entry):
    message = refused_everywhere(entry, None, "uncalled", compression=hvd.Compression.topk)
    assert "call it: compression=hvd.Compression.topk(" in message
