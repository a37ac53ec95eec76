"""Write a file so that a reader, or a process killed mid-write, sees the old content or
the new, never part of either (the checkpoint helpers of both frameworks use it).

1. write the bytes to a temporary file in the target's directory (same file system);
2. flush and fsync it;
3. ``os.replace`` it over the target (atomic on POSIX);
4. fsync the directory, so that the rename itself survives a crash.

A process killed between 1 and 3 leaves its temporary file (``<name>.<random>.tmp``).
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["write_atomically"]


def write_atomically(path: str, data: bytes) -> None:
    """Steps 1-4 of the module docstring. Raises ``OSError`` (nothing replaced)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                         suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
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
