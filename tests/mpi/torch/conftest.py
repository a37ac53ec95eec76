"""One Horovod (torch) initialisation per MPI test process."""

import pytest
import torch

import hvdx.torch as hvd


@pytest.fixture(scope="session", autouse=True)
def horovod():
    torch.set_num_threads(1)
    hvd.init()
    yield hvd
