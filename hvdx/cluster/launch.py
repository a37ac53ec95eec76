"""MPI jobs across an emulated cluster, with MPICH's Hydra launcher.

``mpiexec`` runs inside the cluster's control namespace, so it needs no address in the
caller's namespace. It starts one proxy per emulated host through
:mod:`hvdx.cluster.netns_exec` (its ``-launcher-exec`` hook), and the proxies call back
over the unshaped control network (``-localhost``). The ranks' own traffic goes over the
shaped data network only because of two UCX settings:

- ``UCX_TLS=tcp,self``: all namespaces share the machine's memory, so UCX would
  otherwise move data between "hosts" through shared memory and skip every link;
- ``UCX_NET_DEVICES=data0``: of the host's interfaces, TCP uses the shaped one, not
  the control one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from hvdx.cluster import netns_exec
from hvdx.cluster.netns import DATA_IFACE, EmulatedCluster

__all__ = ["MPI_ENV", "launcher_script", "link_rates_value", "mpiexec_command", "run_mpi"]

MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": DATA_IFACE}


def link_rates_value(spec) -> str:
    """``HVDX_CLUSTER_LINK_RATES`` of a cluster spec: ``"NICbit,UPLINKbit"``."""
    return f"{int(spec.nic)}bit,{int(spec.uplink)}bit"


def launcher_script(cluster: EmulatedCluster) -> str:
    """Writes (once) the ``-launcher-exec`` program into the cluster's work directory.

    Hydra takes a program path, not a command line, hence a two-line shell wrapper
    around ``python netns_exec.py --hosts HOSTS.json``.

    Returns:
        The wrapper's path.
    """
    if not cluster.workdir:
        raise RuntimeError("launcher_script: the cluster is not running")
    path = os.path.join(cluster.workdir, "netns-launcher")
    if os.path.exists(path):
        return path
    hosts = {}
    for host in cluster.hosts:
        entry = {"netns": host.netns,
                 "env": {"HVDX_CLUSTER_HOST": host.name,
                         "HVDX_CLUSTER_RACK": str(host.rack),
                         # The configured rates, from which DS-Sync's rotation takes its
                         # defaults (hvdx.DSSync(link_rates=...)).
                         "HVDX_CLUSTER_LINK_RATES": link_rates_value(cluster.spec)}}
        for key in (host.control_addr, host.data_addr, host.name):
            hosts[key] = entry
    hosts_file = os.path.join(cluster.workdir, "hosts.json")
    with open(hosts_file, "w", encoding="utf-8") as handle:
        json.dump(hosts, handle, indent=1)
    script = (f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
              f"{shlex.quote(os.path.abspath(netns_exec.__file__))} "
              f"--hosts {shlex.quote(hosts_file)} \"$@\"\n")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(script)
    os.chmod(path + ".tmp", 0o755)
    os.replace(path + ".tmp", path)
    return path


def mpiexec_command(cluster: EmulatedCluster, argv: Sequence[str],
                    hosts: Optional[Sequence[Any]] = None, ppn: int = 1,
                    np: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                    mpiexec: str = "mpiexec",
                    extra_args: Sequence[str] = ()) -> List[str]:
    """The command line that runs ``argv`` as an MPI job across emulated hosts.

    Args:
        cluster: a running cluster.
        argv: the program and its arguments (use an absolute interpreter path, e.g.
            ``sys.executable``).
        hosts: hosts to use (indices, names or addresses); default all, in order.
            Ranks fill hosts in order, ``ppn`` per host.
        ppn: ranks per host.
        np: total ranks; default ``len(hosts) * ppn``.
        env: extra variables for every rank (``-genv``); they override
            :data:`MPI_ENV`.
        mpiexec: the Hydra ``mpiexec`` to run.
        extra_args: more ``mpiexec`` options, placed before the program.

    Returns:
        ``["ip", "netns", "exec", CONTROL_NS, "mpiexec", "-launcher", "ssh",
        "-launcher-exec", PROG, "-localhost", CONTROL_ADDR, "-hosts", "A1,A2,...",
        "-n", N, "-ppn", K, "-genv", "UCX_TLS", "tcp,self", "-genv",
        "UCX_NET_DEVICES", "data0", ..., *argv]``.

    Raises:
        ValueError: if ``ppn``/``np`` do not fit the hosts; KeyError: on an unknown host.
    """
    chosen = [cluster.host(h) for h in (cluster.hosts if hosts is None else hosts)]
    if not chosen:
        raise ValueError("hosts=[] names no host")
    if isinstance(ppn, bool) or not isinstance(ppn, int) or ppn < 1:
        raise ValueError(f"ppn={ppn!r} must be a positive integer")
    np = len(chosen) * ppn if np is None else np
    if isinstance(np, bool) or not isinstance(np, int) or not 1 <= np <= len(chosen) * ppn:
        raise ValueError(f"np={np!r} must be from 1 to hosts x ppn = {len(chosen) * ppn}")
    command = ["ip", "netns", "exec", cluster.control_netns, mpiexec,
               "-launcher", "ssh", "-launcher-exec", launcher_script(cluster),
               "-localhost", cluster.control_addr,
               "-hosts", ",".join(h.control_addr for h in chosen),
               "-n", str(np), "-ppn", str(ppn)]
    for key, value in dict(MPI_ENV, **dict(env or {})).items():
        command += ["-genv", str(key), str(value)]
    return command + list(extra_args) + list(argv)


def run_mpi(cluster: EmulatedCluster, argv: Sequence[str], timeout: Optional[float] = None,
            hosts: Optional[Sequence[Any]] = None, ppn: int = 1, np: Optional[int] = None,
            env: Optional[Mapping[str, str]] = None,
            process_env: Optional[Mapping[str, str]] = None,
            **run_kwargs: Any) -> subprocess.CompletedProcess:
    """Runs :func:`mpiexec_command` to completion.

    Args:
        cluster, argv, hosts, ppn, np, env: as for :func:`mpiexec_command`.
        timeout: seconds before the job is killed (``subprocess.TimeoutExpired``). Set
            one: Hydra waits forever for a proxy that never starts.
        process_env: environment of ``mpiexec`` itself (default this process's),
            which Hydra hands on to every rank. ``HVDX_CLUSTER_HOST``/``_RACK``/
            ``_LINK_RATES`` are dropped from it so that each rank sees its own host's values.
        **run_kwargs: passed to :func:`subprocess.run`; output is captured as text
            unless they say otherwise.

    Returns:
        The finished process (``returncode``, ``stdout``, ``stderr``).
    """
    base_env: Dict[str, str] = dict(os.environ if process_env is None else process_env)
    for key in ("HVDX_CLUSTER_HOST", "HVDX_CLUSTER_RACK", "HVDX_CLUSTER_LINK_RATES"):
        base_env.pop(key, None)
    run_kwargs.setdefault("capture_output", True)
    run_kwargs.setdefault("text", True)
    return subprocess.run(mpiexec_command(cluster, argv, hosts=hosts, ppn=ppn, np=np, env=env),
                          env=base_env, timeout=timeout, **run_kwargs)
