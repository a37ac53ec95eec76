"""Text that every machine has without a download: the Python standard library's source.

The ``lm`` benchmark workload trains a byte-level language model on it. The corpus is
the ``.py`` files of the standard library of the interpreter that runs hvdx, found
through :mod:`sysconfig`, read as bytes (vocabulary: the 256 byte values).

Steps of :func:`python_source`:
1. list the ``.py`` files under the standard library's directory, leaving out
   ``site-packages``/``dist-packages`` (installed packages differ between machines) and
   ``__pycache__``, sorted by their path relative to that directory;
2. split *by file*: a file goes to validation when the CRC-32 of its relative path, modulo
   :data:`VALIDATION_MODULUS`, is 0, else to training. The split depends on the names
   alone, so it is the same on every rank and every machine with the same Python
   version, and no file has text on both sides;
3. join each side's files, in that order, into one byte stream (files separated by a
   NUL byte, which Python source never holds), and cut the training stream into
   consecutive windows of ``context`` bytes; a window's target is the same window
   shifted by one byte (the model predicts each next byte);
4. validation: ``validation_windows`` windows at offsets drawn by a generator seeded with
   ``seed``, the same on every rank.
"""

from __future__ import annotations

import os
import sysconfig
import zlib
from typing import List, Optional, Tuple

import numpy as np

from hvdx.datasets import Split

__all__ = ["CorpusMissing", "VALIDATION_MODULUS", "check_sources", "python_source",
           "source_files"]

#: One file in this many (by the CRC-32 of its relative path) is held out for validation.
VALIDATION_MODULUS = 20
#: Folders of installed packages, which differ between machines: never part of the corpus.
_LEFT_OUT = frozenset({"site-packages", "dist-packages", "__pycache__"})
#: The least training text that counts as a corpus (a standard library without its
#: sources has a few stray ``.py`` files at most).
MIN_TRAIN_BYTES = 1_000_000


class CorpusMissing(RuntimeError):
    """The standard library's ``.py`` sources are not on this machine."""


def stdlib_dir() -> str:
    """The standard library's directory of the running interpreter."""
    return sysconfig.get_paths()["stdlib"]


def source_files(root: Optional[str] = None) -> List[str]:
    """Step 1: the ``.py`` files under ``root`` (default: the standard library), as
    paths relative to it, sorted; installed packages and caches left out."""
    root = root or stdlib_dir()
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in _LEFT_OUT)
        found += [os.path.relpath(os.path.join(folder, f), root)
                  for f in files if f.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in found)


def is_validation(relative_path: str) -> bool:
    """Step 2: does this file belong to the validation side?"""
    return zlib.crc32(relative_path.encode()) % VALIDATION_MODULUS == 0


def _stream(root: str, paths: List[str]) -> np.ndarray:
    parts = []
    for path in paths:
        with open(os.path.join(root, path), "rb") as f:
            parts.append(f.read())
    # A bytearray: torch.from_numpy warns on read-only memory.
    return np.frombuffer(bytearray(b"\0".join(parts)), dtype=np.uint8)


def check_sources(root: Optional[str] = None) -> Tuple[str, List[str], List[str]]:
    """Steps 1 and 2 without reading a file: ``(root, training paths, validation
    paths)``, or :class:`CorpusMissing`, naming the directory, when it holds too little
    source (a Python installed without its ``.py`` files)."""
    root = root or stdlib_dir()
    paths = source_files(root) if os.path.isdir(root) else []
    train = [p for p in paths if not is_validation(p)]
    valid = [p for p in paths if is_validation(p)]
    size = sum(os.path.getsize(os.path.join(root, p)) for p in train)
    if size < MIN_TRAIN_BYTES or not valid:
        raise CorpusMissing(
            f"the lm workload trains on the Python standard library's source, but "
            f"{root} holds {len(paths)} .py files ({size:,} bytes for training): "
            f"this Python was installed without its sources. Install them (Debian: "
            f"apt-get install libpython3.11-stdlib; or use a python.org or pyenv "
            f"build), or leave lm out of --workloads.")
    return root, train, valid


def python_source(context: int = 64, validation_windows: int = 256, seed: int = 0,
                  root: Optional[str] = None) -> Split:
    """The standard library's source as next-byte prediction: ``x`` and ``y`` are
    ``N x context`` uint8 arrays, ``y`` being ``x`` shifted by one byte.

    Raises :class:`CorpusMissing`, naming the directory, when it holds too little
    source (a Python installed without its ``.py`` files).
    """
    root, train_paths, valid_paths = check_sources(root)
    train, valid = _stream(root, train_paths), _stream(root, valid_paths)
    x_train, y_train = _windows(train, context)
    starts = np.random.default_rng(seed).integers(0, valid.size - context - 1,
                                                  size=validation_windows)
    rows = valid[starts[:, None] + np.arange(context + 1)]
    return Split(x_train, y_train, rows[:, :-1], rows[:, 1:])


def _windows(stream: np.ndarray, context: int) -> Tuple[np.ndarray, np.ndarray]:
    """Step 3: consecutive windows of ``context + 1`` bytes, as (inputs, targets) views."""
    count = (stream.size - 1) // context
    inputs = stream[:count * context].reshape(count, context)
    targets = stream[1:count * context + 1].reshape(count, context)
    return inputs, targets
