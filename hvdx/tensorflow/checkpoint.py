"""Checkpoints of a whole job for TensorFlow: every rank's state in one file, atomically.

The TensorFlow counterpart of :mod:`hvdx.torch.checkpoint`. Ranks hold different state
under hvdx's strategies (TopK's residuals, the mixing strategies' own variables, slots
and step counters), so rank 0's is not everyone's. The helpers take the objects a
``tf.train.Checkpoint`` takes:

``save_checkpoint(path, model=model, optimizer=opt, hvdx=state)`` (collective):

1. every rank writes ``tf.train.Checkpoint(**objects)`` into a private temporary
   directory and reads the files back as bytes;
2. the bytes are gathered to rank 0 (mpi4py);
3. rank 0 writes one file (``numpy.savez``: the format, the number of ranks, each
   rank's files) atomically (:mod:`hvdx.atomic_file`);
4. rank 0's outcome is broadcast: every rank returns, or raises the same error.

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
import io
import json
import os
import shutil
import tempfile
from typing import Dict

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.mpi.comm import world
from hvdx.atomic_file import write_atomically

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
    comm = world(_hvd.global_process_set)
    directory = tempfile.mkdtemp(prefix="hvdx-ckpt-")
    try:
        tf.train.Checkpoint(**objects).write(os.path.join(directory, _PREFIX))
        files = {name: _read(os.path.join(directory, name))
                 for name in sorted(os.listdir(directory))}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    everyone = comm.gather(files, root=0)
    error = None
    if comm.Get_rank() == 0:
        arrays = {"header": _encode({"format": FORMAT, "size": comm.Get_size(),
                                     "files": [sorted(f) for f in everyone]})}
        for rank, rank_files in enumerate(everyone):
            for i, name in enumerate(sorted(rank_files)):
                arrays[f"r{rank}_{i}"] = np.frombuffer(rank_files[name], np.uint8)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        try:
            write_atomically(os.fspath(path), buffer.getvalue())
        except OSError as exc:
            error = f"save_checkpoint: rank 0 could not write {os.fspath(path)!r}: {exc}"
    error = comm.bcast(error, root=0)
    if error is not None:
        raise OSError(error)


def load_checkpoint(path, **objects):
    """Restore this rank's objects from ``path`` (read on rank 0; collective).

    Returns:
        the ``tf.train.Checkpoint`` restore status (``assert_consumed()`` and friends).

    Raises:
        ValueError: on every rank, if the file is missing, unreadable, not an hvdx
            TensorFlow checkpoint, or holds another number of ranks; nothing is
            restored then.
    """
    comm = world(_hvd.global_process_set)
    size, rank = comm.Get_size(), comm.Get_rank()
    per_rank, error = None, None
    if rank == 0:
        try:
            with np.load(os.fspath(path)) as data:
                header = json.loads(data["header"].tobytes().decode())
                if header.get("format") != FORMAT:
                    raise ValueError("format")
                per_rank = [{name: data[f"r{r}_{i}"].tobytes()
                             for i, name in enumerate(names)}
                            for r, names in enumerate(header["files"])]
        except (OSError, ValueError, KeyError) as exc:
            if isinstance(exc, ValueError) and str(exc) == "format":
                error = (f"load_checkpoint: {os.fspath(path)!r} is not a checkpoint "
                         "written by hvdx.tensorflow.save_checkpoint")
            else:
                error = f"load_checkpoint: cannot read {os.fspath(path)!r} on rank 0: {exc}"
        else:
            if header["size"] != size:
                error = (f"load_checkpoint: {os.fspath(path)!r} holds {header['size']} "
                         f"ranks' state and this job has {size} ranks; resume with "
                         f"{header['size']} ranks")
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ValueError(error)
    mine: Dict[str, bytes] = comm.scatter(per_rank if rank == 0 else None, root=0)
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


def _encode(header: Dict) -> np.ndarray:
    return np.frombuffer(json.dumps(header).encode(), np.uint8)
