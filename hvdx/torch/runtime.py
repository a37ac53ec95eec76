"""``hvd.init`` for hvdx: Horovod's init plus hvdx's job-wide error handling."""

import horovod.torch as _hvd

from hvdx import environment
from hvdx.mpi import wrap_init

__all__ = ["init"]

init = wrap_init(_hvd.init, environment.check_at_init)
