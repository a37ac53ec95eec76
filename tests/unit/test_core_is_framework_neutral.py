"""hvdx.core, and each strategy's ``core_*.py`` in its folder (hvdx/strategies/<name>/),
hold algorithms as numpy and standard-library code only."""

import pkgutil
import subprocess
import sys

import hvdx.core
import hvdx.strategies

FORBIDDEN = ("torch", "tensorflow", "mpi4py", "horovod", "keras")


def test_core_modules_import_no_framework_mpi_or_horovod():
    modules = [f"hvdx.core.{m.name}" for m in pkgutil.iter_modules(hvdx.core.__path__)]
    assert modules, "hvdx.core has no modules"
    folders = [s.name for s in pkgutil.iter_modules(hvdx.strategies.__path__)
               if s.ispkg]
    cores = [f"hvdx.strategies.{s}.{m.name}" for s in folders
             for m in pkgutil.iter_modules([f"{hvdx.strategies.__path__[0]}/{s}"])
             if m.name.startswith("core_")]
    assert cores, "no strategy folder has a core_*.py"
    modules += cores
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"hvdx.core imported: {out}"
