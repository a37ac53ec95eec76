"""Helpers shared by the cluster tests (fixtures live in conftest.py)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent

# Rates two cores can really fill.
NIC = "200mbit"
UPLINK = "50mbit"


def root_skip_reason():
    """Why cluster tests cannot run here, or None."""
    if sys.platform != "linux":
        return "emulated clusters need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated clusters need root (ip netns, tc); run the cluster tests as root"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "emulated clusters need ip and tc (iproute2)"
    return None


def netns_names():
    """Names of every network namespace on the machine."""
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True,
                         check=True).stdout.strip()
    return {entry["name"] for entry in json.loads(out or "[]")}


def tbf_rate(netns, dev):
    """The tbf rate on ``dev`` inside ``netns``, bits per second."""
    out = subprocess.run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    tbf = [q for q in json.loads(out) if q["kind"] == "tbf"]
    return tbf[0]["options"]["rate"] * 8


def child_env():
    """Environment for child Python processes: hvdx importable from this checkout."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)
