"""``write_atomically`` (checkpoints, calibration, step logs): the file ends with the mode
``open(path, "w")`` gives it, whatever the umask, and a write that fails replaces
nothing and leaves no temporary file."""

import contextlib
import os
import stat

import pytest

from hvdx import atomic_file
from hvdx.atomic_file import write_atomically


@contextlib.contextmanager
def umask(mask):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077, 0o027])
def test_a_new_file_has_the_mode_open_gives_it_under_the_umask(tmp_path, mask):
    with umask(mask):
        write_atomically(tmp_path / "checkpoint.pt", b"new")
        with open(tmp_path / "opened", "w"):
            pass
    assert mode(tmp_path / "checkpoint.pt") == 0o666 & ~mask == mode(tmp_path / "opened")
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"new"


def test_a_file_replaced_keeps_its_mode_as_with_open(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    with umask(0o077):
        write_atomically(str(path), b"new")
    assert mode(path) == 0o640 and path.read_bytes() == b"new"


def test_a_write_that_fails_replaces_nothing_and_leaves_no_temporary_file(
        tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")

    def fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_file.os, "fsync", fsync)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_a_taken_temporary_name_is_skipped(tmp_path, monkeypatch):
    names = iter(["taken", "free"])
    monkeypatch.setattr(atomic_file.secrets, "token_hex", lambda n: next(names))
    (tmp_path / "checkpoint.pt.taken.tmp").write_bytes(b"someone else's")
    write_atomically(tmp_path / "checkpoint.pt", b"new")
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"new"
    assert (tmp_path / "checkpoint.pt.taken.tmp").read_bytes() == b"someone else's"
