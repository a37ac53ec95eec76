"""``hvdx info``: what this installation can do, for bug reports and set-up checks.

``hvdx info --json`` prints the same rows as one JSON object (:data:`JSON_KEYS`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from typing import Callable, List, Tuple

from hvdx._version import __version__

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow prints CPU-feature notices at import

__all__ = ["JSON_KEYS", "collect", "render", "render_json"]


def _version(module: str) -> str:
    try:
        return importlib.import_module(module).__version__
    except Exception as e:  # not installed, or fails to import: say which
        return f"not available ({type(e).__name__}: {e})".splitlines()[0]


def _horovod_framework(module: str) -> str:
    try:
        hvd = importlib.import_module(module)
    except Exception as e:
        return f"not available ({type(e).__name__}: {e})".splitlines()[0]
    if not getattr(hvd, "_MPI_LIB_AVAILABLE", True):
        return "extension missing"
    controllers = [n for n, f in (("MPI", hvd.mpi_built), ("Gloo", hvd.gloo_built)) if f()]
    ops = [n for n, f in (("MPI", hvd.mpi_built), ("NCCL", hvd.nccl_built),
                          ("DDL", hvd.ddl_built), ("CCL", hvd.ccl_built),
                          ("Gloo", hvd.gloo_built)) if f()]
    return f"yes (controllers: {', '.join(controllers) or 'none'}; ops: {', '.join(ops) or 'none'})"


def _mpi_library() -> str:
    try:
        from mpi4py import MPI
    except Exception as e:
        return f"not available ({type(e).__name__}: {e})"
    return " ".join(MPI.Get_library_version().split("\n")[0].split())


def _run_ok(cmd: List[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _emulation() -> str:
    is_root = os.geteuid() == 0
    ip = shutil.which("ip") is not None and _run_ok(["ip", "netns", "list"])
    tc = shutil.which("tc") is not None
    ready = is_root and ip and tc
    parts = [f"root: {'yes' if is_root else 'no'}", f"ip netns: {'yes' if ip else 'no'}",
             f"tc: {'yes' if tc else 'no'}"]
    return f"{'available' if ready else 'not available'} ({', '.join(parts)})"


CHECKS: List[Tuple[str, Callable[[], str]]] = [
    ("hvdx", lambda: __version__),
    ("horovod", lambda: _version("horovod")),
    ("horovod.torch", lambda: _horovod_framework("horovod.torch")),
    ("horovod.tensorflow", lambda: _horovod_framework("horovod.tensorflow")),
    ("torch", lambda: _version("torch")),
    ("tensorflow", lambda: _version("tensorflow")),
    ("numpy", lambda: _version("numpy")),
    ("mpi4py", lambda: _version("mpi4py")),
    ("MPI library", _mpi_library),
    ("network emulation", _emulation),
]


#: The keys of ``--json``'s object, for the docs and ``--help``.
JSON_KEYS = ("--json keys: one per line of the text, the same name and the same string: "
             + ", ".join(f"'{name}'" for name, _ in CHECKS) + ".")


def collect() -> List[Tuple[str, str]]:
    """``(name, description)`` for each check, in display order."""
    return [(name, check()) for name, check in CHECKS]


def render(rows: List[Tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def render_json(rows: List[Tuple[str, str]]) -> str:
    """The rows as one JSON object, name to description, in display order."""
    return json.dumps(dict(rows))
