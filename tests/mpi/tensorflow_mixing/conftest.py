"""One Horovod (TensorFlow) initialisation per MPI test process, with dynamic process sets.

DS-Sync registers a Horovod process set per group, which needs
``hvd.init(process_sets="dynamic")``; the tests in ``tests/mpi/tensorflow`` rely on a
plain ``hvd.init()``, so DS-Sync's TensorFlow tests run as their own MPI job.
"""

import pytest
import tensorflow as tf

import hvdx.tensorflow as hvd


@pytest.fixture(scope="session", autouse=True)
def horovod():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init(process_sets="dynamic")
    yield hvd
