"""Import Horovod's framework module, or fail with a message that says what to do."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["import_framework", "check_mpi_built"]

_EXTRA = {"torch": "torch", "tensorflow": "tensorflow"}
_PACKAGE = {"torch": "torch", "tensorflow": "tensorflow"}


def import_framework(framework: str) -> ModuleType:
    """Import ``horovod.<framework>`` after checking the framework and MPI build.

    Raises:
        ImportError: naming the pip extra to install, or how to rebuild Horovod.
    """
    try:
        importlib.import_module(_PACKAGE[framework])
    except ImportError as e:
        raise ImportError(
            f"hvdx.{framework} needs {_PACKAGE[framework]}, which is not installed "
            f"({e}). Install the extra: pip install 'hvdx[{_EXTRA[framework]}]', or run "
            "scripts/setup, which installs every pinned version.") from e
    try:
        # mpi4py first: it initialises MPI with THREAD_MULTIPLE before Horovod loads.
        import mpi4py.MPI  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"hvdx needs mpi4py built against the system MPI ({e}). Run scripts/setup, "
            "or: pip install --no-binary=mpi4py mpi4py==4.1.2") from e
    try:
        module = importlib.import_module(f"horovod.{framework}")
    except ImportError as e:
        raise ImportError(
            f"hvdx.{framework} needs Horovod 0.28.1 with its {framework} extension ({e}). "
            "Run scripts/setup, which builds it from the sdist with MPI.") from e
    check_mpi_built(module, framework)
    return module


def check_mpi_built(module: ModuleType, framework: str) -> None:
    """Raise ``ImportError`` unless ``module`` is a Horovod extension built with MPI."""
    if not getattr(module, "_MPI_LIB_AVAILABLE", True) or not hasattr(module, "mpi_built"):
        raise ImportError(
            f"Horovod's {framework} extension is missing: rebuild Horovod with "
            f"HOROVOD_WITH_{'PYTORCH' if framework == 'torch' else 'TENSORFLOW'}=1 "
            "(scripts/build_horovod does).")
    if not module.mpi_built():
        raise ImportError(
            "Horovod was built without MPI, and hvdx needs MPI (its strategies use mpi4py "
            "on the same communicator). Rebuild it: pip uninstall horovod, then "
            "HOROVOD_WITH_MPI=1 pip install --no-cache-dir horovod==0.28.1 with the fixes "
            "in scripts/build_horovod, or simply run scripts/setup.")
