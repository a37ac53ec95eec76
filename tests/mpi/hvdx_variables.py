"""Set ``HVDX_COMPRESSION`` / ``HVDX_SYNC`` for one test, on this rank, and restore them.

Entering and leaving also forget the specs :mod:`hvdx.environment` built from earlier
values (a TensorFlow tape keeps its DS-Sync or graph state on its spec), so each test
starts from a fresh choice, as a new process would.
"""

import contextlib
import os

from hvdx import environment

VARIABLES = {"compression": environment.COMPRESSION_VARIABLE,
             "sync": environment.SYNC_VARIABLE}


@contextlib.contextmanager
def hvdx_variables(compression=None, sync=None):
    """``HVDX_COMPRESSION=compression`` and ``HVDX_SYNC=sync`` inside the block; a
    ``None`` leaves the variable unset."""
    saved = {name: os.environ.get(name) for name in VARIABLES.values()}
    try:
        for key, value in (("compression", compression), ("sync", sync)):
            os.environ.pop(VARIABLES[key], None)
            if value is not None:
                os.environ[VARIABLES[key]] = value
        environment.forget()
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
        environment.forget()
