"""``hvd.init`` for hvdx: Horovod's init plus hvdx's job-wide error handling."""

import functools

import horovod.torch as _hvd

from hvdx.mpi import install_abort_on_error

__all__ = ["init"]


@functools.wraps(_hvd.init)
def init(*args, **kwargs):
    """Horovod's ``init`` (same arguments), then abort-on-uncaught-exception for the job."""
    result = _hvd.init(*args, **kwargs)
    install_abort_on_error()
    return result
