"""Drop-in replacement for ``horovod.tensorflow``.

``import hvdx.tensorflow as hvd`` gives every public name of ``horovod.tensorflow``
unchanged, except:

- :func:`init` also makes an uncaught exception on one rank abort the whole job;
- :func:`DistributedGradientTape` accepts every Horovod argument plus ``sync=``, and on
  its first ``gradient()`` call checks that all ranks agree on the variables and
  settings before the first allreduce;
- ``Compression`` keeps Horovod's ``none`` and ``fp16`` and adds ``topk`` (bidirectional
  TopK with error feedback); :func:`topk_state` gives a tape's residuals (checkpoint
  them with ``tf.train.Checkpoint``);
- ``Compression.<name>(...)``: a compressor of your own, registered with
  ``hvdx.register_compressor``; :func:`compression_state` gives a tape's residuals.
  Every compression strategy runs on the shared driver
  :mod:`hvdx.tensorflow.compression_driver` (:class:`CompressionState`);
- ``sync=hvdx.mixer(name, ...)``: a mixer of your own, registered with
  ``hvdx.register_mixer``; :func:`mixer_state` gives the tapes' mixing state
  (:class:`MixingState`: checkpoint, ``synchronize_parameters``). Every mixing
  strategy runs on the shared driver :mod:`hvdx.tensorflow.mixing_state`;
- ``sync=hvdx.DSSync(...)`` replaces the gradient allreduce by DS-Sync group averaging
  through Horovod process sets (:mod:`hvdx.strategies.dssync.mixer`);
  :func:`dssync_state` gives the tape's DS-Sync state (checkpoint, ``synchronize_parameters``), and
  :func:`dssync_process_sets` the sets for a static ``hvd.init``;
- ``sync=hvdx.Decentralized(..., order="combine_then_adapt")``: decentralized SGD over a
  graph, mixing with neighbours by MPI point-to-point
  (:mod:`hvdx.strategies.decentralized.mixer`); :func:`decentralized_state` gives the
  tape's state (checkpoint, ``synchronize_parameters``, ``consensus_distance``);
- :func:`save_checkpoint` / :func:`load_checkpoint`: every rank's
  ``tf.train.Checkpoint`` in one file on rank 0, written atomically
  (:mod:`hvdx.tensorflow.checkpoint`);
- :func:`join` refuses, with what to do instead, once a tape or Keras optimizer was
  built with an hvdx strategy (:mod:`hvdx.tensorflow.join_guard`);
- :class:`Stanza`: layer separation, conv workers train the features and FC workers
  the head (:mod:`hvdx.strategies.stanza.tensorflow.trainer`); a trainer, called on every rank each
  step;
- :func:`shutdown`, :func:`start_timeline`, :func:`stop_timeline` are Horovod's, then
  add hvdx's own exchanges to Horovod's timeline file once it is closed
  (:mod:`hvdx.mpi.timeline`).

With no hvdx feature switched on, the tape is Horovod's own, so training is bitwise
identical to Horovod's. Keras users import :mod:`hvdx.tensorflow.keras`.
"""

from hvdx._horovod import import_framework

_hvd = import_framework("tensorflow")

# Every public name of horovod.tensorflow (it has no __all__; a test checks none is missing).
from horovod.tensorflow import *  # noqa: E402,F401,F403

from hvdx.tensorflow.compression import Compression  # noqa: E402,F401
from hvdx.tensorflow.runtime import init, shutdown, start_timeline, stop_timeline  # noqa: E402,F401,E501
from hvdx.tensorflow.gradient_tape import DistributedGradientTape  # noqa: E402,F401
from hvdx.tensorflow.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402,F401
from hvdx.tensorflow.join_guard import join  # noqa: E402,F401
from hvdx.strategies import catalogue as _catalogue  # noqa: E402
from hvdx.strategies.descriptor import load as _load  # noqa: E402

# Any name the catalogue exports here that is not written out below (a new strategy's)
# is loaded by its lazy path when first asked for (PEP 562).
__getattr__, __dir__ = _catalogue.module_exports(__name__, "tensorflow")

# Each built-in strategy's own names, as the catalogue lists them
# (StrategyDescriptor.exports("tensorflow")), written out so that grep and IDEs find
# them; a test checks that each is bound to the catalogue's path. The strategies'
# TensorFlow modules are loaded by path, not imported here: they import hvdx.tensorflow
# themselves (tests/unit/test_no_import_cycles.py).
topk_state = _load("hvdx.tensorflow.compression_residuals:STATE_GETTERS.topk_state")
compression_state = _load("hvdx.tensorflow.compression_residuals:STATE_GETTERS.compression_state")
from hvdx.tensorflow.compression_residuals import CompressionState  # noqa: E402,F401
dssync_state = _load("hvdx.tensorflow.mixing_state:STATE_GETTERS.dssync_state")
dssync_process_sets = _load("hvdx.strategies.dssync.mixer:dssync_process_sets")
from hvdx.strategies.dssync.spec import DSSync  # noqa: E402,F401
decentralized_state = _load("hvdx.tensorflow.mixing_state:STATE_GETTERS.decentralized_state")
from hvdx.strategies.decentralized.spec import Decentralized  # noqa: E402,F401
mixer_state = _load("hvdx.tensorflow.mixing_state:STATE_GETTERS.mixer_state")
from hvdx.tensorflow.mixing_state import MixingState  # noqa: E402,F401
Stanza = _load("hvdx.strategies.stanza.tensorflow.trainer:Stanza")
