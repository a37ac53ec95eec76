"""Write a file so that a reader, or a process killed mid-write, sees the old content or
the new, never part of either (the checkpoint helpers of both frameworks use it).

1. write the bytes to a temporary file in the target's directory (same file system);
2. flush and fsync it;
3. ``os.replace`` it over the target (atomic on POSIX);
4. fsync the directory, so that the rename itself survives a crash.

The file ends with the mode ``open(path, "w")`` would give it: a new file
``0o666 & ~umask`` (the temporary file is created with ``0o666`` and the kernel applies
the umask, as for ``open``; ``tempfile.mkstemp``'s ``0o600`` would hide a checkpoint from
the group that shares it), a file replaced keeps its own mode.

A process killed between 1 and 3 leaves its temporary file (``<name>.<random>.tmp``).
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Tuple

__all__ = ["write_atomically"]

#: Names tried for the temporary file before giving up (each is random).
_ATTEMPTS = 100


def write_atomically(path: str, data: bytes) -> None:
    """Steps 1-4 of the module docstring. Raises ``OSError`` (nothing replaced)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = _temporary(directory, os.path.basename(path))
    try:
        with os.fdopen(handle, "wb") as f:
            try:  # a file replaced keeps its mode
                os.fchmod(f.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            except FileNotFoundError:
                pass
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the rename stands
        pass
    finally:
        os.close(fd)


def _temporary(directory: str, name: str) -> Tuple[int, str]:
    """A new file ``<name>.<random>.tmp`` in ``directory``, open for writing, created
    with mode ``0o666`` less the umask (as ``open``); its descriptor and path."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        temporary = os.path.join(directory, f"{name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name!r} in {directory!r} after "
                          f"{_ATTEMPTS} tries; remove its stale .tmp files")
