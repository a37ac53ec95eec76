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

__all__ = ["JSON_KEYS", "collect", "render", "render_json", "usable_cores"]


def usable_cores() -> int:
    """The cores this process (and the jobs it starts here) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


#: The extensions that load an MPI library: Horovod's two and mpi4py's, by package.
_MPI_EXTENSIONS = (("horovod.torch", "horovod/torch", "mpi_lib*.so"),
                   ("horovod.tensorflow", "horovod/tensorflow", "mpi_lib*.so"),
                   ("mpi4py", "mpi4py", "MPI*.so"))


def _linked_mpi(ldd_output: str) -> List[str]:
    """The MPI libraries (libmpi*, libmpich*) that ``ldd`` resolves, as their paths."""
    found = []
    for line in ldd_output.splitlines():
        name, _, where = line.strip().partition(" => ")
        if name.startswith(("libmpi.so", "libmpich.so")):
            found.append(where.split(" (")[0].strip() or name)
    return found


def _same_mpi_verdict(linked: List[Tuple[str, List[str]]]) -> str:
    """One line from ``(extension, its MPI libraries)`` pairs: do all load one MPI?"""
    linked = [(name, libs) for name, libs in linked if libs]
    if not linked:
        return "unknown (no Horovod or mpi4py extension linked to an MPI found)"
    libraries = {os.path.realpath(lib) for _, libs in linked for lib in libs}
    names = ", ".join(name for name, _ in linked)
    if len(libraries) == 1:
        return f"yes ({linked[0][1][0]}: {names})"
    each = "; ".join(f"{name}: {' '.join(libs)}" for name, libs in linked)
    return (f"NO ({each}). Rebuild mpi4py with the mpicc of Horovod's MPI first on PATH: "
            "pip install --no-binary=mpi4py --no-cache-dir --force-reinstall mpi4py")


def _same_mpi() -> str:
    """Horovod and mpi4py must load one MPI library: read their extensions' links (ldd),
    without importing either framework."""
    import glob
    import importlib.util

    if shutil.which("ldd") is None:
        return "unknown (no ldd)"
    linked = []
    for name, folder, pattern in _MPI_EXTENSIONS:
        top = importlib.util.find_spec(folder.split("/")[0])
        if top is None or not top.submodule_search_locations:
            continue
        base = os.path.join(list(top.submodule_search_locations)[0], *folder.split("/")[1:])
        for path in sorted(glob.glob(os.path.join(base, pattern)))[:1]:
            try:
                out = subprocess.run(["ldd", path], capture_output=True, text=True,
                                     timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            linked.append((name, _linked_mpi(out)))
    return _same_mpi_verdict(linked)


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
    ("same MPI", _same_mpi),
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
