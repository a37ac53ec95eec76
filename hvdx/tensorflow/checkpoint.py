"""Checkpoints of a whole job for TensorFlow: every rank's state in one file, atomically.

The TensorFlow counterpart of :mod:`hvdx.torch.checkpoint`. Ranks hold different state
under hvdx's strategies (TopK's residuals, the mixing strategies' own variables, slots
and step counters), so rank 0's is not everyone's. The helpers take the objects a
``tf.train.Checkpoint`` takes:

``save_checkpoint(path, model=model, optimizer=opt, hvdx=state)`` (collective):

1. every rank writes ``tf.train.Checkpoint(**objects)`` into a private temporary
   directory and reads the files back as bytes;
2. the bytes are gathered to rank 0, which writes one file (pickled: the format, the
   number of ranks, each rank's files) atomically; every rank returns, or raises the
   same error (:func:`hvdx.mpi.job_checkpoint.gather_to_file`).

``load_checkpoint(path, model=model, optimizer=opt, hvdx=state)`` (collective): rank 0
reads and checks the file, broadcasts the verdict, scatters each rank its own files;
every rank writes them to a temporary directory (kept until the process ends) and
restores its objects from them (``tf.train.Checkpoint.read``: variables created later,
such as Keras' slots, are restored when they are created).

Example::

    hvdx.tensorflow.save_checkpoint("ckpt.hvdx", model=model, optimizer=opt)
    hvdx.tensorflow.load_checkpoint("ckpt.hvdx", model=model, optimizer=opt)
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import tempfile
from typing import Dict

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx.mpi.comm import world
from hvdx.mpi.job_checkpoint import gather_to_file, scatter_from_file

__all__ = ["FORMAT", "load_checkpoint", "save_checkpoint"]

#: The ``format`` entry of an hvdx TensorFlow checkpoint file.
FORMAT = "hvdx-tf-checkpoint-1"
_PREFIX = "ckpt"


def save_checkpoint(path, **objects) -> None:
    """Write every rank's ``tf.train.Checkpoint(**objects)`` to ``path`` on rank 0
    (collective; module docstring).

    Raises:
        OSError: on every rank, if rank 0 could not write the file.
    """
    directory = tempfile.mkdtemp(prefix="hvdx-ckpt-")
    try:
        tf.train.Checkpoint(**objects).write(os.path.join(directory, _PREFIX))
        files = {name: _read(os.path.join(directory, name))
                 for name in sorted(os.listdir(directory))}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    gather_to_file(world(_hvd.global_process_set), path, files, FORMAT, pickle.dumps)


def load_checkpoint(path, **objects):
    """Restore this rank's objects from ``path`` (read on rank 0; collective).

    Returns:
        the ``tf.train.Checkpoint`` restore status (``assert_consumed()`` and friends).

    Raises:
        ValueError: on every rank, if the file is missing, unreadable, not an hvdx
            TensorFlow checkpoint, or holds another number of ranks; nothing is
            restored then.
    """
    mine: Dict[str, bytes] = scatter_from_file(world(_hvd.global_process_set), path,
                                               FORMAT, pickle.loads)
    # Kept until the process ends: TensorFlow restores variables created later (Keras'
    # slots, hvdx's SWA means) from these files, when they are created.
    directory = tempfile.mkdtemp(prefix="hvdx-ckpt-")
    atexit.register(shutil.rmtree, directory, True)
    for name, content in mine.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(content)
    return tf.train.Checkpoint(**objects).read(os.path.join(directory, _PREFIX))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
