"""Drop-in replacement for ``horovod.torch``.

``import hvdx.torch as hvd`` gives every public name of ``horovod.torch`` unchanged,
except the ones hvdx extends without changing their behaviour:

- :func:`init` also makes an uncaught exception on one rank abort the whole job;
- :func:`DistributedOptimizer` accepts every Horovod argument plus ``sync=``, and checks
  that all ranks agree on the model and settings before the first collective;
- ``Compression`` keeps Horovod's ``none`` and ``fp16`` and adds ``topk`` (bidirectional
  TopK with error feedback, run by hvdx's own optimizer);
- ``sync=hvdx.DSSync(...)`` replaces the gradient allreduce by DS-Sync group averaging
  through Horovod process sets (``hvd.init(process_sets="dynamic")``, or static sets
  from :func:`dssync_process_sets`); ``sync=hvdx.Decentralized(...)`` by neighbour
  averaging over a graph;
- :func:`save_checkpoint` / :func:`load_checkpoint`: every rank's state (residuals,
  local parameters and momenta, step counters) in one file on rank 0, written
  atomically (:mod:`hvdx.torch.checkpoint`);
- :func:`broadcast_optimizer_state` also handles hvdx's optimizers, for Horovod's
  rank-0 resume recipe (:mod:`hvdx.torch.optimizer_state`);
- :func:`join` refuses, with what to do instead, while an hvdx strategy trains
  (:mod:`hvdx.torch.join`);
- :func:`shutdown`, :func:`start_timeline`, :func:`stop_timeline` are Horovod's, then
  add hvdx's own exchanges to Horovod's timeline file once it is closed
  (:mod:`hvdx.mpi.timeline`).

With no hvdx feature switched on, :func:`DistributedOptimizer` returns Horovod's own
optimizer, so training is bitwise identical to Horovod's.
"""

from hvdx._horovod import import_framework

_hvd = import_framework("torch")

# Every public name of horovod.torch (it has no __all__; a test checks none is missing).
from horovod.torch import *  # noqa: E402,F401,F403

from hvdx.torch.compression import Compression  # noqa: E402,F401
from hvdx.torch.runtime import init, shutdown, start_timeline, stop_timeline  # noqa: E402,F401,E501
from hvdx.torch.optimizer import DistributedOptimizer  # noqa: E402,F401
from hvdx.torch.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402,F401
from hvdx.torch.optimizer_state import broadcast_optimizer_state  # noqa: E402,F401
from hvdx.torch.join import join  # noqa: E402,F401
from hvdx.strategies import catalogue as _catalogue  # noqa: E402
from hvdx.strategies.descriptor import load as _load  # noqa: E402

# Any name the catalogue exports here that is not written out below (a new strategy's)
# is loaded by its lazy path when first asked for (PEP 562).
__getattr__, __dir__ = _catalogue.module_exports(__name__, "torch")

# Each built-in strategy's own names, as the catalogue lists them
# (StrategyDescriptor.exports("torch")), written out so that grep and IDEs find them; a
# test checks that each is bound to the catalogue's path. The strategies' torch
# modules are loaded by path, not imported here: they import hvdx.torch themselves
# (tests/unit/test_no_import_cycles.py).
dssync_process_sets = _load("hvdx.strategies.dssync.mixer:dssync_process_sets")
from hvdx.strategies.dssync.spec import DSSync  # noqa: E402,F401
from hvdx.strategies.decentralized.spec import Decentralized  # noqa: E402,F401
Stanza = _load("hvdx.strategies.stanza.torch.trainer:Stanza")
