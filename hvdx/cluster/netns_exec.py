"""MPICH Hydra's launcher hook for emulated hosts: run a command inside a host's netns.

Hydra, started with ``-launcher ssh -launcher-exec PROG``, calls ``PROG [options] HOST
COMMAND...`` as it would call ssh: its own options first, then the host, then the
remote command, which ssh would join with spaces for the remote shell. This script
plays ssh: it maps HOST (an emulated host's control address) to that host's network
namespace and runs ``ip netns exec NS bash -c COMMAND`` with ``HVDX_CLUSTER_HOST`` and
``HVDX_CLUSTER_RACK`` set, which Hydra's proxy passes on to the ranks it starts.

Usage (the cluster writes a wrapper that supplies ``--hosts``)::

    python netns_exec.py --hosts HOSTS.json [ssh options ...] HOST COMMAND...

``HOSTS.json`` maps each host key to ``{"netns": NAME, "env": {VAR: VALUE}}``.
Standard library only: it runs as a script, without hvdx on the path.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Sequence

__all__ = ["build_argv", "main", "split_args"]

_SSH_OPTIONS_WITH_VALUE = {"-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l",
                           "-m", "-O", "-o", "-p", "-Q", "-R", "-S", "-W", "-w"}


def split_args(argv: Sequence[str]) -> "tuple[str, str, str]":
    """Splits ``--hosts FILE [options ...] HOST COMMAND ...`` into (FILE, HOST, COMMAND).

    Parsed as ssh parses its own: options (Hydra passes ``-x``) come first and mean
    nothing here, the first other word is the host, and every later word is joined
    with spaces into the command for the remote shell. Hydra 4.0 passes the command as
    several words (``"/usr/bin/hydra_pmi_proxy" --control-port ...``); a command given
    as one word comes out the same.

    Raises:
        ValueError: if the arguments do not have that form.
    """
    argv = list(argv)
    if len(argv) < 4 or argv[0] != "--hosts":
        raise ValueError("usage: netns_exec.py --hosts FILE [options ...] HOST COMMAND")
    rest = argv[2:]
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        # ssh options that take a value; Hydra uses none of them, but a user's
        # launcher arguments might.
        i += 2 if rest[i] in _SSH_OPTIONS_WITH_VALUE else 1
    if i + 1 >= len(rest):
        raise ValueError(f"netns_exec: no host and command in {rest!r}")
    return argv[1], rest[i], " ".join(rest[i + 1:])


def build_argv(hosts: Dict[str, dict], host: str, command: str) -> "tuple[List[str], Dict]":
    """The argv and extra environment that run ``command`` on emulated ``host``.

    Raises:
        KeyError: if ``host`` is not in ``hosts``.
    """
    if host not in hosts:
        raise KeyError(f"netns_exec: {host!r} is no emulated host (known: "
                       f"{', '.join(sorted(hosts))})")
    entry = hosts[host]
    return ["ip", "netns", "exec", entry["netns"], "bash", "-c", command], entry.get("env", {})


def main(argv: Sequence[str]) -> int:
    """Replaces this process with the command inside the host's namespace."""
    try:
        path, host, command = split_args(argv)
        with open(path, encoding="utf-8") as handle:
            hosts = json.load(handle)
        args, env = build_argv(hosts, host, command)
    except (ValueError, KeyError, OSError) as error:
        # 255 is what ssh exits with when it cannot reach the host.
        sys.stderr.write(f"{error}\n")
        return 255
    os.execvpe(args[0], args, dict(os.environ, **env))
    return 255  # not reached: exec replaces the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
