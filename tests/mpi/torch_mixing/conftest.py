"""One Horovod (torch) initialisation per MPI test process, with dynamic process sets.

DS-Sync registers a Horovod process set per group, which needs
``hvd.init(process_sets="dynamic")``; the tests in ``tests/mpi/torch`` rely on a plain
``hvd.init()``, so DS-Sync's tests run as their own MPI job.
"""

import pytest
import torch

import hvdx.torch as hvd


@pytest.fixture(scope="session", autouse=True)
def horovod():
    torch.set_num_threads(1)
    hvd.init(process_sets="dynamic")
    yield hvd
