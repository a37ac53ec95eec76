"""``hvd.init`` for hvdx: Horovod's init plus hvdx's job-wide error handling; Horovod's
``shutdown``, ``start_timeline`` and ``stop_timeline`` plus hvdx's exchanges in the
timeline (:mod:`hvdx.mpi.timeline`)."""

import horovod.torch as _hvd

from hvdx import environment
from hvdx.mpi import timeline, wrap_init

__all__ = ["init", "shutdown", "start_timeline", "stop_timeline"]

init = wrap_init(_hvd.init, environment.check_at_init)
shutdown = timeline.wrap_shutdown(_hvd.shutdown)
start_timeline = timeline.wrap_start_timeline(_hvd.start_timeline, _hvd.rank)
stop_timeline = timeline.wrap_stop_timeline(_hvd.stop_timeline)
