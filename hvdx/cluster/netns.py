"""An emulated multi-host cluster built from Linux network namespaces, veths and tc.

Everything lives inside namespaces this module creates; nothing is ever added to the
namespace it is called from. Each veth is created directly inside its namespaces
(``ip -n A link add X type veth peer name Y netns B``), so no interface exists in the
caller's namespace even for an instant, and deleting the namespaces removes them all.

Namespace names carry the creating process id (``hvdx<pid>c<n>-h0``) so that
:func:`~hvdx.cluster.teardown.cleanup_stale` can remove what a crashed or killed run
left behind.

This module builds the cluster, runs it (:class:`EmulatedCluster`) and changes its
rates over time (:class:`ContentionTimer`); the ``ip`` and ``tc`` commands are run
through :mod:`hvdx.cluster.iproute`, a link is shaped by :mod:`hvdx.cluster.shaping`, and
clusters are torn down at exit, on signals and after a killed run by
:mod:`hvdx.cluster.teardown`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple, Union

from hvdx.cluster.iproute import ClusterUnavailable, require_support, run
from hvdx.cluster.shaping import Link
from hvdx.cluster.spec import ClusterSpec, ContentionEvent, parse_rate
from hvdx.cluster.teardown import kill_netns_processes, register, unregister

__all__ = ["CONTROL_IFACE", "ContentionTimer", "DATA_IFACE", "EmulatedCluster", "Host"]

DATA_IFACE = "data0"
CONTROL_IFACE = "ctl0"
_BRIDGE = "br0"
_UPLINK = "up0"
_DATA_NET = "10.77.0.{}/16"
_CONTROL_NET = "10.78.0.{}/24"
_CONTROL_ADDR = "10.78.0.254"

HostKey = Union[int, str, "Host"]


@dataclass(frozen=True)
class Host:
    """One emulated host.

    Attributes:
        index: host number, counted rack by rack from 0.
        name: ``"h<index>"``.
        rack: the rack it sits in.
        netns: its network namespace.
        data_addr: address of its shaped data interface :data:`DATA_IFACE`.
        control_addr: address of its unshaped control interface (the MPI launcher's).
    """

    index: int
    name: str
    rack: int
    netns: str
    data_addr: str
    control_addr: str



class EmulatedCluster:
    """Racks of emulated hosts behind shaped links, as a context manager.

    Topology (one namespace per box)::

        [ctl] br0 10.78.0.254 ---- ctl0 of every host (unshaped, MPI launcher only)

        [core] br0 -- r0 ====== up0 [rack0] br0 -- h0 ------ data0 [host h0]
                   |                          +-- h1 ------ data0 [host h1]
                   +-- r1 ====== up0 [rack1] br0 -- h2 ------ data0 [host h2]
                                              +-- h3 ------ data0 [host h3]

        ====  uplink, shaped at ``spec.uplink`` on both ends (both directions)
        ----  host NIC, shaped at ``spec.nic`` on both ends (both directions)

    Host ``h<i>`` has ``data0`` = 10.77.0.<i+1>/16 (one L2 subnet across all racks) and
    ``ctl0`` = 10.78.0.<i+1>/24.

    Example::

        with EmulatedCluster(ClusterSpec(racks=2, nic="200mbit", uplink="50mbit")) as c:
            subprocess.run(c.exec_prefix("h0") + ["python", "worker.py"])

    Teardown (deleting every namespace made, after killing what still runs inside)
    happens on ``__exit__``, on an exception during set-up, on SIGINT/SIGTERM and at
    interpreter exit. A run killed with SIGKILL is cleaned by
    :func:`~hvdx.cluster.teardown.cleanup_stale`.
    """

    _count = 0
    _count_lock = threading.Lock()

    def __init__(self, spec: ClusterSpec, prefix: str = "hvdx"):
        """Describes the cluster; nothing is created until :meth:`start`.

        Args:
            spec: the cluster to build.
            prefix: start of every namespace name (letters only).

        Raises:
            TypeError: if ``spec`` is not a :class:`ClusterSpec`.
            ValueError: if ``prefix`` is not 1 to 16 letters.
        """
        if not isinstance(spec, ClusterSpec):
            raise TypeError(f"spec={spec!r} must be a ClusterSpec")
        # Letters only: the pid follows the prefix, and cleanup_stale must read it back
        # unambiguously ("hvdx2" + pid 123 would read as "hvdx" + pid 2123).
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z]{1,16}", prefix):
            raise ValueError(f"prefix={prefix!r} must be 1 to 16 letters")
        with EmulatedCluster._count_lock:
            seq = EmulatedCluster._count
            EmulatedCluster._count += 1
        self.spec = spec
        self.run_id = f"{prefix}{os.getpid()}c{seq}"
        self.control_netns = f"{self.run_id}-ctl"
        self.control_addr = _CONTROL_ADDR
        self.core_netns = f"{self.run_id}-core"
        self.rack_netns = [f"{self.run_id}-r{j}" for j in range(spec.racks)]
        self.hosts: List[Host] = [
            Host(index=i, name=f"h{i}", rack=spec.rack_of(i), netns=f"{self.run_id}-h{i}",
                 data_addr=_DATA_NET.format(i + 1).split("/")[0],
                 control_addr=_CONTROL_NET.format(i + 1).split("/")[0])
            for i in range(spec.num_hosts)]
        self.workdir: Optional[str] = None
        self._created: List[str] = []
        self._links: Dict[str, List[Link]] = {}
        self._rates: Dict[str, int] = {}
        self._lock = threading.RLock()
        self._timers: List["ContentionTimer"] = []
        self._closed = False
        # A forked child inherits this object and the atexit hook; only the creating
        # process may tear the cluster down.
        self._owner_pid = os.getpid()

    # -- life cycle -------------------------------------------------------------------

    def __enter__(self) -> "EmulatedCluster":
        if not self._created:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> "EmulatedCluster":
        """Creates the namespaces, bridges, veths, addresses and qdiscs.

        Raises:
            ClusterUnavailable: without root, without ``ip``/``tc``, or if the kernel
                refuses network namespaces.
            RuntimeError: if a later ``ip``/``tc`` step fails (what was made is removed).
        """
        if self._created or self._closed:
            raise RuntimeError("an EmulatedCluster can be started once")
        require_support()
        register(self)
        try:
            self.workdir = tempfile.mkdtemp(prefix=f"{self.run_id}-")
            self._add_netns(self.control_netns, probe=True)
            if self.spec.latency or self.spec.uplink_latency:
                self._require_netem()
            self._add_netns(self.core_netns)
            for ns in self.rack_netns:
                self._add_netns(ns)
            for host in self.hosts:
                self._add_netns(host.netns)
            self._build_switches()
            for host in self.hosts:
                self._build_host(host)
            self._shape()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Removes everything :meth:`start` made. Safe to call more than once.

        Does nothing in a forked child of the process that started the cluster.
        """
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._closed = True
            for timer in self._timers:
                timer.stop()
            created, self._created = self._created, []
        for ns in reversed(created):
            kill_netns_processes(ns)
            run(["ip", "netns", "del", ns], check=False)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        unregister(self)

    @property
    def namespaces(self) -> List[str]:
        """Every namespace this cluster has created and not yet removed."""
        return list(self._created)

    # -- building -----------------------------------------------------------------------

    def _add_netns(self, name: str, probe: bool = False) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the cluster was closed while it was being built")
            # Recorded before it exists, so that a signal arriving mid-way removes it.
            self._created.append(name)
        proc = run(["ip", "netns", "add", name], check=False)
        if proc.returncode != 0:
            with self._lock:
                if name in self._created:
                    self._created.remove(name)
            if probe:
                raise ClusterUnavailable(
                    f"hvdx.cluster: this process cannot create network namespaces "
                    f"({proc.stderr.strip()}); it needs root with CAP_SYS_ADMIN and "
                    "CAP_NET_ADMIN; run on localhost instead")
            raise RuntimeError(f"hvdx.cluster: cannot create network namespace {name}: "
                               f"{proc.stderr.strip()}")
        # No IPv6: its router solicitations and DAD would add stray bytes to the interface
        # counters that tests and benchmarks read. A kernel without IPv6 needs nothing.
        run(["ip", "netns", "exec", name, "sysctl", "-q", "-w",
             "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
            check=False)
        run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _require_netem(self) -> None:
        # Some kernels (minimal VM kernels) are built without netem; say so up front
        # rather than failing half-way through shaping.
        probe = ["tc", "-n", self.control_netns, "qdisc", "add", "dev", "lo", "root",
                 "netem", "delay", "1ms"]
        proc = run(probe, check=False)
        if proc.returncode != 0:
            raise ClusterUnavailable(
                f"latency={self.spec.latency!r}, uplink_latency={self.spec.uplink_latency!r}"
                " need tc's netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM): "
                f"{proc.stderr.strip()}; leave latency unset on this machine")
        run(["tc", "-n", self.control_netns, "qdisc", "del", "dev", "lo", "root"])

    def _bridge(self, ns: str, addr: Optional[str] = None) -> None:
        run(["ip", "-n", ns, "link", "add", _BRIDGE, "type", "bridge", "forward_delay", "0"])
        if addr:
            run(["ip", "-n", ns, "addr", "add", addr, "dev", _BRIDGE])
        run(["ip", "-n", ns, "link", "set", _BRIDGE, "up"])

    def _veth(self, ns: str, name: str, peer_ns: str, peer: str, bridge_peer: bool,
              addr: Optional[str] = None, bridge_self: bool = False) -> None:
        run(["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", peer,
             "netns", peer_ns])
        if addr:
            run(["ip", "-n", ns, "addr", "add", addr, "dev", name])
        up = ["master", _BRIDGE, "up"]
        run(["ip", "-n", ns, "link", "set", name] + (up if bridge_self else ["up"]))
        run(["ip", "-n", peer_ns, "link", "set", peer] + (up if bridge_peer else ["up"]))

    def _build_switches(self) -> None:
        self._bridge(self.control_netns, f"{_CONTROL_ADDR}/24")
        self._bridge(self.core_netns)
        for j, ns in enumerate(self.rack_netns):
            self._bridge(ns)
            self._veth(ns, _UPLINK, self.core_netns, f"r{j}", bridge_peer=True,
                       bridge_self=True)

    def _build_host(self, host: Host) -> None:
        rack_ns = self.rack_netns[host.rack]
        self._veth(host.netns, DATA_IFACE, rack_ns, host.name, bridge_peer=True,
                   addr=_DATA_NET.format(host.index + 1))
        self._veth(host.netns, CONTROL_IFACE, self.control_netns, host.name,
                   bridge_peer=True, addr=_CONTROL_NET.format(host.index + 1))

    def _shape(self) -> None:
        spec = self.spec
        for host in self.hosts:
            links = [Link(host.netns, DATA_IFACE, spec.latency),
                     Link(self.rack_netns[host.rack], host.name, None)]
            self._links[host.name] = links
            self._rates[host.name] = spec.nic
        for j, ns in enumerate(self.rack_netns):
            links = [Link(ns, _UPLINK, spec.uplink_latency),
                     Link(self.core_netns, f"r{j}", None)]
            self._links[f"uplink{j}"] = links
            self._rates[f"uplink{j}"] = spec.uplink
        for name, links in self._links.items():
            for link in links:
                link.shape(self._rates[name])

    # -- use ----------------------------------------------------------------------------

    def host(self, key: HostKey) -> Host:
        """Looks a host up by index, name (``"h1"``), data or control address.

        Raises:
            KeyError: if no host matches.
        """
        if isinstance(key, Host):
            return key
        for host in self.hosts:
            if key in (host.index, host.name, host.data_addr, host.control_addr) \
                    and not isinstance(key, bool):
                return host
        raise KeyError(f"no emulated host {key!r}: hosts are h0 to h{len(self.hosts) - 1}")

    def exec_prefix(self, host: HostKey) -> List[str]:
        """``["ip", "netns", "exec", NS]``: prepend to a command to run it on ``host``."""
        return ["ip", "netns", "exec", self.host(host).netns]

    def interface_counters(self, host: HostKey, iface: str = DATA_IFACE) -> Tuple[int, int]:
        """``(tx_bytes, rx_bytes)`` of ``host``'s data interface, as the kernel counts
        them: frames with their headers (one set per GSO super-frame, so within a rack
        the count is close to the payload), and TX includes TCP retransmissions, which
        a full uplink queue causes. RX at the receiver counts what was delivered."""
        out = run(["ip", "-n", self.host(host).netns, "-s", "-j", "link", "show", "dev",
                   iface]).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def links(self) -> List[str]:
        """Names of the shaped links: ``h<i>`` for host NICs, ``uplink<j>`` per rack."""
        return list(self._links)

    def rate(self, target: str) -> int:
        """The current rate of one link (see :meth:`links`), bits per second."""
        with self._lock:
            return self._rates[self._targets(target)[0]]

    def configured_rate(self, target: str) -> int:
        """The spec's rate for ``target`` (what contention events restore)."""
        return self.spec.nic if target.startswith("h") else self.spec.uplink

    def _targets(self, target: str) -> List[str]:
        if target == "uplink":
            return [f"uplink{j}" for j in range(self.spec.racks)]
        if target not in self._links:
            raise KeyError(f"target={target!r} is no link of this cluster: use one of "
                           f"{', '.join(self._links)} or uplink")
        return [target]

    def set_rate(self, target: str, rate: Union[int, float, str]) -> None:
        """Changes a link's rate in both directions, effective at once.

        Args:
            target: ``"h<i>"``, ``"uplink<j>"`` or ``"uplink"`` (all uplinks).
            rate: new rate (``"10mbit"`` or bits per second).

        Raises:
            KeyError: on an unknown target; ValueError: on a bad rate;
            RuntimeError: if the cluster is not running.
        """
        bits = parse_rate(rate, "rate")
        with self._lock:
            if self._closed or not self._created:
                raise RuntimeError("set_rate: the cluster is not running")
            for name in self._targets(target):
                for link in self._links[name]:
                    link.set_rate(bits)
                self._rates[name] = bits

    def start_contention(self, events: Optional[Iterable[ContentionEvent]] = None
                         ) -> "ContentionTimer":
        """Applies contention events (default: the spec's) on a timer thread.

        Times count from this call. The returned timer's ``log`` records what was
        applied and when; it stops on :meth:`close`.
        """
        timer = ContentionTimer(self, self.spec.contention if events is None else events)
        with self._lock:
            self._timers.append(timer)
        timer.start()
        return timer

    def describe(self) -> Dict[str, object]:
        """The spec plus the hosts' names, racks and addresses, for run records."""
        return {"spec": self.spec.to_dict(),
                "hosts": [{"name": h.name, "rack": h.rack, "data_addr": h.data_addr}
                          for h in self.hosts]}


class ContentionTimer(threading.Thread):
    """Applies contention events to a running cluster at their time offsets.

    Attributes:
        log: ``(seconds since start, target, rate in bit/s)`` per change applied.
    """

    def __init__(self, cluster: EmulatedCluster, events: Iterable[ContentionEvent]):
        super().__init__(name=f"{cluster.run_id}-contention", daemon=True)
        self.cluster = cluster
        self.log: List[Tuple[float, str, int]] = []
        self._stop_event = threading.Event()
        changes = []
        for event in events:
            if not isinstance(event, ContentionEvent):
                raise TypeError(f"{event!r} is not a ContentionEvent")
            cluster._targets(event.target)  # unknown targets fail here, not mid-run
            changes.append((event.at, event.target, event.rate))
            if event.until is not None:
                restore = cluster.configured_rate(event.target)
                changes.append((event.until, event.target, restore))
        self.changes = sorted(changes, key=lambda change: change[0])

    def run(self) -> None:
        start = time.monotonic()
        for at, target, rate in self.changes:
            if self._stop_event.wait(max(0.0, start + at - time.monotonic())):
                return
            try:
                self.cluster.set_rate(target, rate)
            except RuntimeError:
                return  # the cluster went away under us: nothing left to shape
            self.log.append((time.monotonic() - start, target, rate))

    def stop(self) -> None:
        """Stops before the next change (a change in progress completes)."""
        self._stop_event.set()


