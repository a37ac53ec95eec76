"""DS-Sync and decentralized SGD chosen by ``HVDX_SYNC`` for an unchanged Horovod script
(TensorFlow: the tape and the Keras optimizer).

The variable is set on every rank inside the test (``hvdx_variables``) before the tape
or optimizer is built, as ``mpirun -genv`` would set it; the reference is the same
strategy passed in code. A tape is made every step: the spec built from the variable
is one per process and value, so its mixing state carries over from step to step.
"""

import pathlib
import sys

import numpy as np
import pytest
import tensorflow as tf

import hvdx
import hvdx.tensorflow as hvd
from quadratic_steps import trainer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from hvdx_variables import hvdx_variables  # noqa: E402
from mpi4py import MPI  # noqa: E402

# What this module proves does not depend on the size of the job; at 4 ranks on the
# suite's 2 cores every collective waits for a descheduled rank, so the 4-rank job's
# time goes to the tests that need 4 ranks (groups, graphs, shards, roles).
pytestmark = [pytest.mark.skipif(MPI.COMM_WORLD.Get_size() > 2,
                                 reason="the environment switch: checked at 1 and 2 ranks"),
              pytest.mark.dssync, pytest.mark.decentralized]

DECENTRALIZED = "Decentralized(graph='one-peer-exp', order='combine_then_adapt')"
SYNCS = {"DSSync()": lambda: hvdx.DSSync(),
         DECENTRALIZED: lambda: hvdx.Decentralized("one-peer-exp",
                                                   order="combine_then_adapt")}


def trained(entry, steps=3, sync=None):
    """``x`` after ``steps`` steps on the per-rank quadratic of :mod:`quadratic_steps`;
    the Keras optimizer takes them by ``minimize``, as ``fit`` does (Horovod's own
    optimizer synchronizes, and checks across ranks, in its gradient computation)."""
    x = tf.Variable(tf.zeros([6]))
    centre = np.arange(6, dtype=np.float32) * (hvd.rank() + 1)
    step, optimizer = trainer(entry, sync, x, centre, lr=0.3)
    if entry.startswith("keras"):
        def step():
            optimizer.minimize(lambda: 0.5 * tf.reduce_sum((x - centre) ** 2), [x])
    for _ in range(steps):
        step()
    return x.numpy()


def refused_everywhere(entry, value, name):
    """The ``ValueError`` of the first step, after checking that every rank raised the
    same message and that no rank was left in a collective."""
    with pytest.raises(ValueError) as info:
        with hvdx_variables(sync=value):
            trained(entry, steps=1)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after.{entry}.{name}")
    assert total.numpy().tolist() == [float(hvd.size())] * 2
    return message


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape-eager", "keras-eager"])
@pytest.mark.parametrize("value", sorted(SYNCS))
def test_a_sync_from_the_environment_trains_bitwise_like_the_same_sync_in_code(
        entry, value):
    with hvdx_variables(sync=value):
        from_environment = trained(entry)
    from_code = trained(entry, sync=SYNCS[value]())
    assert np.array_equal(from_environment, from_code)
    assert not np.array_equal(from_code, np.zeros(6))


@pytest.mark.mpi(min_size=1)
def test_a_tape_in_a_tf_function_takes_the_sync_from_the_environment_too():
    with hvdx_variables(sync="DSSync()"):
        from_environment = trained("tape-function")
    assert np.array_equal(from_environment, trained("tape-function", sync=hvdx.DSSync()))


@pytest.mark.mpi(min_size=1)
def test_rank_zero_says_once_which_sync_the_environment_chose_for_the_tapes(capsys):
    with hvdx_variables(sync="DSSync()"):
        trained("tape-eager")
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("[hvdx] HVDX_SYNC=")]
    assert len(said) == (hvd.rank() == 0)
    assert all(line.startswith("[hvdx] HVDX_SYNC='DSSync()': DS-Sync, DSSync(schedule="
                               "'rotation'") and line.endswith("(DistributedGradientTape)")
               for line in said)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("entry", ["tape-eager", "keras-eager"])
def test_a_value_that_is_not_accepted_fails_every_rank_naming_the_variable(entry):
    message = refused_everywhere(entry, "DSSync(cross_every=4)", "unaccepted")
    assert "HVDX_SYNC='DSSync(cross_every=4)'" in message
    assert "unexpected keyword argument 'cross_every'" in message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape-eager", "keras-eager"])
def test_a_rank_launched_with_another_strategy_fails_every_rank(entry):
    message = refused_everywhere(entry, DECENTRALIZED if hvd.rank() == 1 else "DSSync()",
                                 "another")
    assert "setting 'HVDX_SYNC' differs between ranks" in message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape-eager", "keras-eager"])
def test_a_rank_launched_without_the_variable_fails_every_rank(entry):
    message = refused_everywhere(entry, "DSSync()" if hvd.rank() == 1 else None, "unset")
    assert "HVDX_SYNC" in message and "ranks disagree" in message


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("entry", ["tape-eager", "tape-function"])
def test_a_decentralized_without_an_order_runs_on_the_tape_in_the_order_it_can(
        entry, capsys):
    """An unchanged tape script under HVDX_SYNC="Decentralized(...)" cannot pass the
    tape an order: it trains combine-then-adapt, bitwise as that order in code, and
    rank 0's line says so; the same value keeps adapt-then-combine in Keras."""
    value = "Decentralized('one-peer-exp')"
    with hvdx_variables(sync=value):
        from_environment = trained(entry, steps=4)
    combine_first = hvdx.Decentralized("one-peer-exp", order="combine_then_adapt")
    assert np.array_equal(from_environment, trained(entry, steps=4, sync=combine_first))
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith(f"[hvdx] HVDX_SYNC={value!r}")]
    assert len(said) == (hvd.rank() == 0)
    assert all("order='combine_then_adapt'" in line for line in said), said
    with hvdx_variables(sync=value):
        in_keras = trained("keras-eager")
    assert np.array_equal(in_keras, trained("keras-eager", sync=hvdx.Decentralized()))


@pytest.mark.mpi(min_size=2)
def test_an_order_the_tape_cannot_run_set_by_the_environment_says_the_value_that_works():
    """Named by the variable, adapt-then-combine is refused on every rank with the value
    to set instead, as a VariableError: hvdx's hook prints it alone, no traceback."""
    from hvdx.environment_variables import VariableError

    value = "Decentralized('ring', order='adapt_then_combine')"
    with pytest.raises(VariableError) as info:
        with hvdx_variables(sync=value):
            trained("tape-eager", steps=1)
    message = str(info.value)
    assert len(set(hvd.allgather_object(message))) == 1
    assert message.startswith(f"HVDX_SYNC={value!r}: ")
    assert "HVDX_SYNC=\"Decentralized(graph='ring', order='combine_then_adapt')\"" \
        in message
    total = hvd.allreduce(tf.ones(2), op=hvd.Sum, name="after.tape.order")
    assert total.numpy().tolist() == [float(hvd.size())] * 2
