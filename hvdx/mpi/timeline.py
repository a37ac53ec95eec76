"""hvdx's own exchanges in Horovod's timeline (``HOROVOD_TIMELINE``, ``hvd.start_timeline``).

Horovod's timeline shows what goes through Horovod's ops; hvdx's own traffic (mpi4py:
TopK's pair exchange, decentralized SGD's neighbour exchange, Stanza's messages, a
registered compressor's allgather) does not pass there. This module records each of
those exchanges on the rank that writes the timeline, and adds them to Horovod's file
once Horovod has closed it:

1. recording: only while a timeline is on and only on Horovod's rank 0, the one that
   writes it (``HOROVOD_TIMELINE=<file>`` at ``hvd.init()``, or ``hvd.start_timeline``
   called through hvdx's module). An exchange reads :data:`active` (one boolean: nothing
   else happens while it is false), and when it is true keeps a span: the exchange
   (``HVDX_TOPK_ALLGATHER``, ...), the row it belongs to (``topk``, ``neighbors
   float32``, ...), its wall-clock start and end and the bytes it sent and received;
2. merging: after Horovod has closed the file (hvdx's ``hvd.shutdown``,
   ``hvd.stop_timeline``, ``hvd.start_timeline`` of another file, or at interpreter
   exit: the hook is registered before Horovod's own, so it runs after Horovod's
   shutdown), :func:`merge_into` reads the JSON, takes Horovod's
   ``start_time_since_epoch_in_micros`` (the first ``process_name`` event), and appends
   one process per row after Horovod's (``hvdx: <row>``, sorted after every tensor),
   each span a complete event (``"ph": "X"``, ``ts`` and ``dur`` in microseconds since
   Horovod's start) named after the exchange, with the bytes in ``args``. Horovod's own
   text is kept byte for byte; the file is replaced atomically
   (:func:`hvdx.atomic_file.write_atomically`). A missing or unreadable file, or one
   that is not Horovod's JSON, is left as it is, with one warning on standard error; an
   empty one (Horovod wrote no event: no Horovod op ran) gets a header of hvdx's own,
   timed from when recording began.

With no span recorded the file is not touched at all. Spans are kept in memory, at most
:data:`LIMIT` per file (the rest are counted and reported once at the merge).

Standard library only.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Iterable, List, Optional, Sequence, Tuple

from hvdx.atomic_file import write_atomically

__all__ = ["LIMIT", "active", "after_init", "finish", "install_exit_hook", "merge_into",
           "now", "record", "wrap_shutdown", "wrap_start_timeline", "wrap_stop_timeline"]

#: Whether this process records spans now (read by every exchange; nothing else is
#: done while it is false).
active = False

#: The most spans kept for one timeline file.
LIMIT = 250_000

#: A span: (exchange, row, start_us, end_us, bytes sent, bytes received), wall clock.
Span = Tuple[str, str, int, int, int, int]

_lock = threading.Lock()
_path: Optional[str] = None   # the file being recorded for
_began_us = 0                 # when recording for it began (wall clock, microseconds)
_spans: List[Span] = []
_dropped = 0
_hook_installed = False
_warned = set()

#: ``HOROVOD_TIMELINE``'s value that makes ``hvd.start_timeline`` usable without a file.
_DYNAMIC = "DYNAMIC"


def now() -> int:
    """Wall-clock microseconds since the epoch (Horovod's timeline start is in these)."""
    return time.time_ns() // 1000


def record(exchange: str, row: str, start_us: int, sent: int = 0, received: int = 0) -> None:
    """Keep the span of ``exchange`` on ``row`` from ``start_us`` (:func:`now`, read
    while :data:`active`) to now. Call it only where ``start_us`` was taken; a span
    begun before recording started (``start_us`` 0) or ending after it stopped is
    dropped."""
    global _dropped
    if not active or not start_us:
        return
    if len(_spans) >= LIMIT:
        _dropped += 1
        return
    _spans.append((exchange, row, int(start_us), now(), int(sent), int(received)))


# --- lifecycle --------------------------------------------------------------------------

def install_exit_hook() -> None:
    """Register the merge at interpreter exit, once. Call it before Horovod's ``init``
    registers its shutdown: exit hooks run last-registered first, so this one runs
    after Horovod has closed the file."""
    global _hook_installed
    if not _hook_installed:
        atexit.register(_at_exit)
        _hook_installed = True


def after_init(rank: int) -> None:
    """After ``hvd.init()`` on ``rank``: record for ``HOROVOD_TIMELINE``'s file when it
    names one (not ``DYNAMIC``) and this is rank 0 (Horovod's writer)."""
    path = os.environ.get("HOROVOD_TIMELINE")
    if rank != 0 or not path or path == _DYNAMIC:
        return
    _begin(path)


def wrap_start_timeline(horovod_start_timeline, rank):
    """Horovod's ``start_timeline``, then (on rank 0, ``rank()``) recording for its file;
    a file recorded for before, which Horovod has closed by then, is merged first."""

    def start_timeline(file_path, mark_cycles=False):
        result = horovod_start_timeline(file_path, mark_cycles)
        if rank() == 0:
            _begin(file_path)
        return result

    _describe(start_timeline, horovod_start_timeline,
              "\n\nhvdx: its own exchanges are added to the file once it is closed "
              "(hvd.stop_timeline, hvd.shutdown, or at exit).")
    return start_timeline


def wrap_stop_timeline(horovod_stop_timeline):
    """Horovod's ``stop_timeline`` (which closes the file), then the merge."""

    def stop_timeline():
        result = horovod_stop_timeline()
        finish()
        return result

    _describe(stop_timeline, horovod_stop_timeline,
              "\n\nhvdx: then adds its own exchanges to the closed file.")
    return stop_timeline


def wrap_shutdown(horovod_shutdown):
    """Horovod's ``shutdown`` (which closes the timeline file), then the merge."""

    def shutdown():
        result = horovod_shutdown()
        finish()
        return result

    _describe(shutdown, horovod_shutdown,
              "\n\nhvdx: then adds its own exchanges to Horovod's timeline file, if one "
              "was written.")
    return shutdown


def finish() -> None:
    """Stop recording and merge the spans into the file they were recorded for (after
    Horovod closed it). Nothing happens when nothing was being recorded."""
    global active, _path, _spans, _dropped
    with _lock:
        path, spans, dropped, began = _path, _spans, _dropped, _began_us
        active, _path, _spans, _dropped = False, None, [], 0
    if path is None or not spans:
        return
    if dropped:
        _warn(f"hvdx kept the first {LIMIT} of its exchanges for the timeline "
              f"{path}; {dropped} more are not in it")
    merge_into(path, spans, began)


def _begin(path: str) -> None:
    global active, _path, _began_us
    path = os.path.abspath(path)  # as Horovod opened it, whatever the cwd at the merge
    if _path == path:
        return  # Horovod goes on writing the same file
    finish()
    with _lock:
        _path, _began_us = path, now()
        active = True


def _at_exit() -> None:
    try:
        finish()
    except Exception as e:  # noqa: BLE001 (an exit hook must not raise)
        _warn(f"hvdx could not add its exchanges to Horovod's timeline: {e}")


# --- the merge ---------------------------------------------------------------------------

def merge_into(path: str, spans: Sequence[Span], began_us: Optional[int] = None) -> bool:
    """Append ``spans`` to Horovod's timeline ``path`` (module docstring, step 2).

    Args:
        path: the timeline file, closed by Horovod.
        spans: ``(exchange, row, start_us, end_us, sent, received)``, wall clock.
        began_us: the timeline's start for a file Horovod left empty (default: the
            first span's start).

    Returns:
        Whether the file was written; ``False`` (with one warning per file) when it is
        missing, unreadable or not Horovod's JSON, which is then left as it is.
    """
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        _warn(f"hvdx could not read Horovod's timeline {path} to add its exchanges "
              f"({e}); it is left as it is", key=path)
        return False
    if not text.strip():
        start = began_us if began_us is not None else min(s[2] for s in spans)
        header = [{"name": "process_name", "ph": "M", "pid": 0,
                   "args": {"start_time_since_epoch_in_micros": int(start)}},
                  {"name": "process_sort_index", "ph": "M", "pid": 0,
                   "args": {"sort_index": 0}}]
        events = header + _events(spans, start, 1)
        body = "[\n" + ",\n".join(json.dumps(e) for e in events) + "]"
    else:
        try:
            existing = json.loads(text)
            start = _start_time(existing)
        except ValueError as e:
            _warn(f"hvdx could not add its exchanges to Horovod's timeline {path}: {e}; "
                  "it is left as it is", key=path)
            return False
        first_pid = 1 + max((e["pid"] for e in existing
                             if isinstance(e, dict) and isinstance(e.get("pid"), int)),
                            default=0)
        ours = ",\n".join(json.dumps(e) for e in _events(spans, start, first_pid))
        # Horovod's text as it is, its closing bracket moved after hvdx's events.
        head = text[:text.rstrip().rfind("]")].rstrip()
        body = head + (",\n" if existing else "\n") + ours + "]"
    try:
        write_atomically(path, body.encode("utf-8"))
    except OSError as e:
        _warn(f"hvdx could not write its exchanges into Horovod's timeline {path} ({e}); "
              "it is left as it is", key=path)
        return False
    return True


def _start_time(events) -> int:
    """Horovod's ``start_time_since_epoch_in_micros``; ``ValueError`` if absent."""
    if not isinstance(events, list):
        raise ValueError("not a JSON list of events")
    for e in events:
        if isinstance(e, dict) and e.get("name") == "process_name" and \
                isinstance(e.get("args"), dict) and \
                isinstance(e["args"].get("start_time_since_epoch_in_micros"), int):
            return e["args"]["start_time_since_epoch_in_micros"]
    raise ValueError("no process_name event with start_time_since_epoch_in_micros")


def _events(spans: Iterable[Span], start_us: int, first_pid: int) -> List[dict]:
    """One process per row (in order of first appearance), numbered from ``first_pid``
    and sorted after Horovod's; one complete event per span."""
    pids = {}
    rows, events = [], []
    for exchange, row, begin, end, sent, received in spans:
        pid = pids.get(row)
        if pid is None:
            pid = pids[row] = first_pid + len(pids)
            rows += [{"name": "process_name", "ph": "M", "pid": pid,
                      "args": {"name": f"hvdx: {row}"}},
                     {"name": "process_sort_index", "ph": "M", "pid": pid,
                      "args": {"sort_index": pid}}]
        events.append({"ph": "X", "name": exchange, "ts": begin - start_us,
                       "dur": max(end - begin, 0), "pid": pid,
                       "args": {"bytes_sent": sent, "bytes_received": received}})
    return rows + events


def _warn(message: str, key: Optional[str] = None) -> None:
    key = message if key is None else key
    if key in _warned:
        return
    _warned.add(key)
    try:
        print(f"[hvdx] {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _describe(wrapper, original, note: str) -> None:
    for name in ("__module__", "__name__", "__qualname__"):
        try:
            setattr(wrapper, name, getattr(original, name))
        except AttributeError:
            pass
    wrapper.__doc__ = (original.__doc__ or "") + note
    wrapper.__wrapped__ = original
