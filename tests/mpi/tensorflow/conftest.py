"""One Horovod (TensorFlow) initialisation per MPI test process."""

import pytest
import tensorflow as tf

import hvdx.tensorflow as hvd


@pytest.fixture(scope="session", autouse=True)
def horovod():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    yield hvd
