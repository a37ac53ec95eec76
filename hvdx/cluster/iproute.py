"""The ``ip`` and ``tc`` commands (iproute2) the emulated cluster is built with: whether
this machine can run them to build one (:func:`require_support`, else
:class:`ClusterUnavailable`), and running one (:func:`run`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Sequence

__all__ = ["ClusterUnavailable", "require_support", "run"]


class ClusterUnavailable(RuntimeError):
    """This machine or user cannot build an emulated cluster (callers fall back to
    running every rank on localhost)."""



def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"hvdx.cluster: `{' '.join(argv)}` failed "
                           f"(exit {proc.returncode}): {proc.stderr.strip()}")
    return proc



def require_support() -> None:
    if sys.platform != "linux":
        raise ClusterUnavailable("hvdx.cluster needs Linux network namespaces; run on "
                                 "localhost instead")
    if os.geteuid() != 0:
        raise ClusterUnavailable("hvdx.cluster needs root (CAP_NET_ADMIN) to create "
                                 "network namespaces; run as root or on localhost instead")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ClusterUnavailable(f"hvdx.cluster needs {' and '.join(missing)} (Debian "
                                 "package iproute2); install it or run on localhost")


