"""Tearing emulated clusters down: every started cluster is closed at interpreter exit
and on SIGINT/SIGTERM (:func:`register`), a namespace's processes are killed before it
is deleted (:func:`kill_netns_processes`), and what a killed run left behind is removed
by :func:`cleanup_stale`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Dict, List, Protocol

from hvdx.cluster.iproute import run

__all__ = ["Closable", "cleanup_stale", "kill_netns_processes", "register", "unregister"]

#: The start of a namespace's or work directory's name, as
#: :class:`~hvdx.cluster.netns.EmulatedCluster` names them (``hvdx<pid>c<n>-h0``).
_NAME_RE = r"^{prefix}(\d+)c(\d+)-"


class Closable(Protocol):
    """What teardown needs of a cluster: its
    :meth:`~hvdx.cluster.netns.EmulatedCluster.close`."""

    def close(self) -> None:
        ...


# Strong references: a started cluster that its caller dropped must still be torn down.
_live: "set[Closable]" = set()
_previous_handlers: Dict[int, object] = {}
# Reentrant: a signal handler that tears clusters down may interrupt register.
_hooks_lock = threading.RLock()
_atexit_registered = False


def register(cluster: Closable) -> None:
    """Closes ``cluster`` at interpreter exit and on SIGINT/SIGTERM (then the signal's
    previous handler runs), until :func:`unregister`."""
    global _atexit_registered
    with _hooks_lock:
        _live.add(cluster)
        if not _atexit_registered:
            atexit.register(_close_all)
            _atexit_registered = True
        # Signal handlers can only be set from the main thread; elsewhere, teardown still
        # happens through __exit__ and atexit.
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                if signum not in _previous_handlers:
                    _previous_handlers[signum] = signal.signal(signum, _on_signal)


def unregister(cluster: Closable) -> None:
    """Forgets ``cluster`` (it was closed)."""
    with _hooks_lock:
        _live.discard(cluster)


def _close_all() -> None:
    for cluster in list(_live):
        cluster.close()


def _on_signal(signum, frame) -> None:
    _close_all()
    previous = _previous_handlers.get(signum)
    if callable(previous):
        previous(signum, frame)  # e.g. Python's SIGINT handler raises KeyboardInterrupt
    elif previous != signal.SIG_IGN:
        # Die of the same signal, as the process would have without us.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def kill_netns_processes(ns: str) -> None:
    """Kills the processes inside namespace ``ns`` (SIGTERM, then SIGKILL)."""
    # Deleting a namespace that still has processes only unlinks its name: its veths
    # live on until they exit. These are processes started inside our own namespace.
    pids = [int(p) for p in run(["ip", "netns", "pids", ns], check=False).stdout.split()
            if p.isdigit() and int(p) != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 1.0
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if _pid_alive(pid)]
            time.sleep(0.02)
        pids = alive
        if not pids:
            return


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        # A zombie (dead, not yet reaped by its parent) counts as dead.
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cleanup_stale(prefix: str = "hvdx") -> List[str]:
    """Removes namespaces (and work directories) of runs whose process is gone.

    Only names of this module's form, ``<prefix><pid>c<n>-...``, are considered, and
    only those whose ``pid`` no longer runs; a live run's namespaces are never touched.

    Args:
        prefix: the prefix the runs were created with.

    Returns:
        The namespaces removed.
    """
    if shutil.which("ip") is None:
        return []
    pattern = re.compile(_NAME_RE.format(prefix=re.escape(prefix)))
    listing = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    names = [entry["name"] for entry in json.loads(listing or "[]")]
    removed = []
    for name in names:
        match = pattern.match(name)
        if match and not _pid_alive(int(match.group(1))):
            kill_netns_processes(name)
            if run(["ip", "netns", "del", name], check=False).returncode == 0:
                removed.append(name)
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        match = pattern.match(entry)
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    return removed

