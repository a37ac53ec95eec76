"""``hvdx topology``: the hosts, racks, measured links and DS-Sync rotation of a job.

Run it as an MPI job (every rank takes part, rank 0 prints)::

    mpirun -n 4 python -m hvdx.cli topology --probe

or let it build an emulated cluster (:mod:`hvdx.cluster`, root) and start itself there::

    hvdx topology --racks 2 --hosts-per-rack 2 --nic 1gbit --uplink 100mbit --probe

Steps, on every rank:

1. hosts from the shared-memory split; racks from ``HVDX_RACK`` /
   ``HVDX_CLUSTER_RACK`` (:mod:`hvdx.mpi.topology`);
2. with ``--probe``, the bandwidth probe (:mod:`hvdx.mpi.probe`) measures every pair;
   :func:`hvdx.core.bandwidth.measured_topology` then gives the racks (when no label is
   set), the slow links and who crosses first in each rack;
3. the rotation :class:`hvdx.DSSync` would use on that topology is built (Wang et al.,
   arXiv 2007.03298; :class:`hvdx.strategies.dssync.core_schedule.RotationSchedule`);
4. rank 0 prints it all (:func:`render`), ending with the ``HVDX_RACK`` of every host and
   the ``HVDX_LINK_RATES`` that give hvdx this topology on a real cluster
   (:func:`settings`); with ``--json``, one JSON object instead (:func:`figures`, keys
   in :data:`JSON_KEYS`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.bandwidth import THRESHOLD_RATIO, MeasuredTopology, measured_topology
from hvdx.core.topology import Partition, Topology
from hvdx.core.units import format_rate, parse_bytes, parse_rate
from hvdx.strategies.dssync.core_schedule import RotationSchedule, default_rotation_parameters

__all__ = ["JSON_KEYS", "TopologyReport", "add_arguments", "figures", "render",
           "run_topology", "settings"]

_CLUSTER_FLAGS = ("cluster_spec", "racks", "hosts_per_rack", "nic", "uplink", "latency",
                  "uplink_latency", "contention")
# Rank variables the MPI launchers set, read before MPI starts (see _quiet_rank).
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")

#: The keys of ``--json``'s object, for the docs and ``--help``.
JSON_KEYS = (
    "--json keys: ranks; hosts and racks (the ranks of each, lists of lists); host_names "
    "(per host: HVDX_CLUSTER_HOST or the MPI processor name); rack_source; "
    "racks_from_probe (null unless labels gave the racks) and racks_from_probe_agree; "
    "probe (null without --probe, else bytes, seconds, bps: bits/s from row to column, "
    "null on the diagonal and between ranks of one host, slow_links: [i, j, bits/s] "
    "below threshold_ratio x the fastest, median_bps: inside_rack and across_racks or "
    "null, suggested: intra_phases and cross_ranks or null); rotation (intra_phases, "
    "cross_ranks, period, steps: step, kind and groups of each, places: every rank's "
    "place in its rack, places_changed_by_probe); settings (HVDX_RACK: the value for "
    "each host, HVDX_LINK_RATES: the value or null, link_rates_bps: what it parses to, "
    "link_rates_source: probe or the variable it was read from, or null); with an "
    "emulated cluster, also emulated_cluster (its spec: racks, hosts_per_rack, nic, "
    "uplink, latency, uplink_latency, contention).")


@dataclass(frozen=True)
class TopologyReport:
    """What rank 0 prints.

    Attributes:
        measured: hosts, racks, crossing places and slow links.
        rack_source: where the racks come from (a variable's name, ``"probe"``, or
            ``"hosts"`` when every host is its own rack).
        schedule: the rotation built on ``measured``.
        matrix: bytes per second from row to column (NaN: one host), or ``None``.
        probe_bytes: bytes per transfer of the probe.
        probe_seconds: how long the probe took.
        probe_racks: the fast groups of the probe when labels gave the racks (to
            compare), else ``None``.
        host_names: every host's name (``HVDX_CLUSTER_HOST``, else the MPI processor
            name), in host order, or ``None``.
        environment_rates: ``(variable, (nic, uplink))``: link rates in bits/s that
            rank 0 read from ``HVDX_LINK_RATES`` / ``HVDX_CLUSTER_LINK_RATES``, or
            ``None``.
    """

    measured: MeasuredTopology
    rack_source: str
    schedule: RotationSchedule
    matrix: Optional[np.ndarray] = None
    probe_bytes: int = 0
    probe_seconds: float = 0.0
    probe_racks: Optional[Partition] = None
    host_names: Optional[Tuple[str, ...]] = None
    environment_rates: Optional[Tuple[str, Tuple[int, int]]] = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hvdx.cluster import add_cluster_arguments

    parser.add_argument("--probe", action="store_true",
                        help="measure every pair of ranks (point-to-point transfers)")
    parser.add_argument("--probe-bytes", metavar="SIZE",
                        help="bytes per transfer, e.g. 512kb; implies --probe "
                             "(default: 4MiB)")
    parser.add_argument("--probe-same-host", action="store_true",
                        help="also measure ranks of one host (shared memory); implies --probe")
    # Strings, checked by _options so that a bad value is one error line naming it.
    parser.add_argument("--intra-phases", metavar="K", default="1",
                        help="rotation: intra-rack phases per cross phase")
    parser.add_argument("--cross-ranks", metavar="C", help="rotation: ranks per rack that "
                        "cross (default: all)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the text: the same figures, "
                             "unrounded (keys below)")
    add_cluster_arguments(parser)
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="with an emulated cluster: ranks per host")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="with an emulated cluster: seconds before the job is killed")


def run_topology(args: argparse.Namespace) -> int:
    """The ``hvdx topology`` verb: an emulated cluster, or one rank of an MPI job."""
    try:
        options = _options(args)
    except ValueError:
        if _quiet_rank():
            return 2  # rank 0 says it; one line, not one per rank
        raise
    if any(getattr(args, name, None) is not None for name in _CLUSTER_FLAGS):
        return _on_cluster(args, options)
    report = collect(**options)
    if report is not None:
        print(json.dumps(figures(report)) if args.json else render(report),
              flush=True)
    return 0


def collect(probe: bool, probe_bytes: Optional[int], intra_phases: int,
            cross_ranks: Optional[int], same_host: bool = False,
            comm=None) -> Optional[TopologyReport]:
    """Module steps 1-3 (collective); the report on rank 0, ``None`` elsewhere."""
    from mpi4py import MPI

    from hvdx.mpi.probe import DEFAULT_PROBE_BYTES, probe_bandwidth
    from hvdx.mpi.topology import RACK_VARIABLES, host_labels, rack_labels
    from hvdx.strategies.dssync.spec import LINK_RATES_VARIABLES, link_rates_from_environment

    comm = MPI.COMM_WORLD if comm is None else comm
    hosts = host_labels(comm)
    racks = rack_labels(comm)
    names = comm.gather(os.environ.get("HVDX_CLUSTER_HOST") or MPI.Get_processor_name(),
                        root=0)
    source = comm.bcast(next((v for v in RACK_VARIABLES if os.environ.get(v)), "labels")
                        if racks else "hosts", root=0)
    matrix, nbytes, seconds, probe_racks = None, 0, 0.0, None
    if probe:
        result = probe_bandwidth(comm, probe_bytes or DEFAULT_PROBE_BYTES, hosts, same_host)
        matrix, nbytes, seconds = result.matrix, result.nbytes, result.seconds
        measured = measured_topology(matrix, hosts, racks)
        if racks:
            probe_racks = measured_topology(matrix, hosts).topology.rack_groups()
        source = source if racks else "probe"
    else:
        topology = Topology.from_ranks(hosts, racks if racks else hosts)
        measured = MeasuredTopology(topology, topology.positions_in_rack(), ())
    width = max(len(g) for g in measured.topology.rack_groups())
    schedule = RotationSchedule(measured.topology, intra_phases=intra_phases,
                                cross_ranks=None if cross_ranks is None
                                else min(cross_ranks, width),
                                places=measured.places)
    if comm.Get_rank() != 0:
        return None
    rates = link_rates_from_environment()
    variable = next((v for v in LINK_RATES_VARIABLES if os.environ.get(v, "").strip()), None)
    host_names = tuple(names[g[0]] for g in measured.topology.host_groups())
    return TopologyReport(measured, source, schedule, matrix, nbytes, seconds, probe_racks,
                          host_names, None if rates is None else (variable, rates))


def render(report: TopologyReport) -> str:
    """The printed report: hosts, racks, matrix, slow links, rotation (module step 4)."""
    t = report.measured.topology
    lines = [f"{_n(t.size, 'rank')} on {_n(t.n_hosts, 'host')} (shared-memory split), "
             f"{_n(t.n_racks, 'rack')} (from {report.rack_source})"]
    lines.append("hosts: " + "; ".join(f"host {i}: ranks {_ranks(g)}"
                                      for i, g in enumerate(t.host_groups())))
    lines.append("racks: " + "; ".join(f"rack {i}: ranks {_ranks(g)}"
                                      for i, g in enumerate(t.rack_groups())))
    if report.probe_racks is not None:
        agree = "agree with" if report.probe_racks == t.rack_groups() else "differ from"
        lines.append("racks from the probe: " + "; ".join(
            f"rack {i}: ranks {_ranks(g)}" for i, g in enumerate(report.probe_racks)) +
            f" ({agree} the labels)")
    if report.matrix is not None:
        lines.append("")
        lines += _matrix_lines(report.matrix, report.probe_bytes, report.probe_seconds)
        slow = report.measured.slow_links
        lines.append(f"slow links (below {THRESHOLD_RATIO:g} x the fastest): " +
                     (", ".join(f"{i}-{j} ({_rate(_link(report.matrix, i, j))})"
                                for i, j in slow) if slow else "none"))
        suggestion = _suggestion(report)
        if suggestion:
            lines.append(suggestion)
    s = report.schedule
    lines.append("")
    lines.append(f"DS-Sync rotation (intra_phases={s.intra_phases}, "
                 f"cross_ranks={s.cross_ranks}), period {s.period}:")
    for step in range(s.period):
        groups = " ".join("(" + " ".join(map(str, g)) + ")" for g in s.partition(step))
        lines.append(f"  step {step} {s.phase_kind(step):>5}: {groups}")
    if s.places != t.positions_in_rack():
        lines.append("  crossing order changed by the probe: places in rack " +
                     " ".join(f"{r}:{p}" for r, p in enumerate(s.places)))
    lines.append("")
    lines += _settings_lines(report)
    return "\n".join(lines)


def settings(report: TopologyReport) -> Dict[str, object]:
    """The variables that give hvdx this topology on a real cluster.

    1. ``HVDX_RACK``: per host, its rack's index (every rank of a host sets the same;
       :mod:`hvdx.mpi.topology` numbers racks by first appearance, as here, so the
       labels rebuild these racks);
    2. ``HVDX_LINK_RATES`` (``"nic,uplink"``, as
       :func:`hvdx.strategies.dssync.spec.parse_link_rates` reads it): the rates DS-Sync reads in
       this job (``HVDX_LINK_RATES``, else ``HVDX_CLUSTER_LINK_RATES``: an emulated cluster's
       configured rates); else the probe's median rates inside a rack and across racks, rounded to
       the three digits the text shows; else ``None``. The value is written so that it parses back
       to ``link_rates_bps`` exactly.

    Returns:
        ``{"HVDX_RACK": [str per host], "HVDX_LINK_RATES": str or None,
        "link_rates_bps": [nic, uplink] or None, "link_rates_source": "probe", a
        variable's name, or None}``.
    """
    t = report.measured.topology
    medians = _median_rates(report)
    if report.environment_rates is not None:
        source, rates = report.environment_rates
    elif medians is not None:
        rates, source = tuple(int(float(f"{r * 8:.3g}")) for r in medians), "probe"
    else:
        rates, source = None, None
    return {"HVDX_RACK": [str(t.racks[g[0]]) for g in t.host_groups()],
            "HVDX_LINK_RATES": None if rates is None else
            ",".join(_exact_rate(r) for r in rates),
            "link_rates_bps": None if rates is None else list(rates),
            "link_rates_source": source}


def figures(report: TopologyReport) -> Dict[str, object]:
    """What ``--json`` prints (:data:`JSON_KEYS`): the report's figures, unrounded."""
    t, s, m = report.measured.topology, report.schedule, report.matrix
    probe = None
    if m is not None:
        medians = _median_rates(report)
        suggested = _suggested(report)
        probe = {
            "bytes": report.probe_bytes, "seconds": report.probe_seconds,
            "bps": [[None if i == j or np.isnan(m[i, j]) else float(m[i, j] * 8)
                     for j in range(m.shape[1])] for i in range(m.shape[0])],
            "threshold_ratio": THRESHOLD_RATIO,
            "slow_links": [[i, j, _link(m, i, j) * 8] for i, j in report.measured.slow_links],
            "median_bps": None if medians is None else
            {"inside_rack": medians[0] * 8, "across_racks": medians[1] * 8},
            "suggested": None if suggested is None else
            {"intra_phases": suggested[0], "cross_ranks": suggested[1]}}
    return {
        "ranks": t.size,
        "hosts": [list(g) for g in t.host_groups()],
        "host_names": None if report.host_names is None else list(report.host_names),
        "racks": [list(g) for g in t.rack_groups()],
        "rack_source": report.rack_source,
        "racks_from_probe": None if report.probe_racks is None else
        [list(g) for g in report.probe_racks],
        "racks_from_probe_agree": None if report.probe_racks is None else
        report.probe_racks == t.rack_groups(),
        "probe": probe,
        "rotation": {
            "intra_phases": s.intra_phases, "cross_ranks": s.cross_ranks, "period": s.period,
            "steps": [{"step": step, "kind": s.phase_kind(step),
                       "groups": [list(g) for g in s.partition(step)]}
                      for step in range(s.period)],
            "places": list(s.places),
            "places_changed_by_probe": s.places != t.positions_in_rack()},
        "settings": settings(report)}


# --- helpers ----------------------------------------------------------------------------

def _options(args: argparse.Namespace) -> dict:
    """Validated options of the MPI part (ValueError naming the flag)."""
    probe_bytes = None
    if args.probe_bytes is not None:
        probe_bytes = parse_bytes(args.probe_bytes, "--probe-bytes")
    return {"probe": bool(args.probe or probe_bytes or args.probe_same_host),
            "probe_bytes": probe_bytes, "same_host": bool(args.probe_same_host),
            "intra_phases": _count(args.intra_phases, "--intra-phases", 1),
            "cross_ranks": _count(args.cross_ranks, "--cross-ranks", None)}


def _count(text: Optional[str], flag: str, default: Optional[int]) -> Optional[int]:
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{flag}={text!r} must be a positive integer")
    return value


def _quiet_rank() -> bool:
    """An MPI rank other than 0 (from the launcher's variables, before MPI starts)."""
    return any(os.environ.get(v, "0") not in ("", "0") for v in _RANK_VARIABLES)


def _on_cluster(args: argparse.Namespace, options: dict) -> int:
    """Builds the emulated cluster and runs this verb on it as an MPI job."""
    import hvdx
    from hvdx.cluster import ClusterSpec, EmulatedCluster, run_mpi

    spec = ClusterSpec.from_args(args)  # every bad value is reported before anything exists
    argv = [sys.executable, "-m", "hvdx.cli", "topology"]
    if options["probe"]:
        argv += ["--probe"]
    if options["probe_bytes"]:
        argv += ["--probe-bytes", str(options["probe_bytes"])]
    if options["same_host"]:
        argv += ["--probe-same-host"]
    argv += ["--intra-phases", str(options["intra_phases"])]
    if options["cross_ranks"]:
        argv += ["--cross-ranks", str(options["cross_ranks"])]
    if args.json:
        argv += ["--json"]
    # The ranks import this checkout's hvdx, whatever their working directory.
    root = os.path.dirname(os.path.dirname(os.path.abspath(hvdx.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [root, os.environ.get("PYTHONPATH")])))
    with EmulatedCluster(spec) as cluster:
        if not args.json:
            print(f"emulated cluster: {spec.racks} racks x {spec.hosts_per_rack} hosts, NIC "
                  f"{format_rate(spec.nic)}, uplink {format_rate(spec.uplink)}" +
                  "".join(f", {e.target} at {format_rate(e.rate)} from {e.at:g} s"
                          for e in spec.contention), flush=True)
        timer = cluster.start_contention() if spec.contention else None
        try:
            # With --json, rank 0's object is read back to add the cluster to it: one
            # object on stdout, as without a cluster.
            output = {"stdout": subprocess.PIPE} if args.json else {}
            proc = run_mpi(cluster, argv, ppn=args.ranks_per_host, timeout=args.timeout,
                           process_env=env, capture_output=False, **output)
        finally:
            if timer is not None:
                timer.stop()
    if args.json:
        try:
            print(json.dumps(dict(json.loads(proc.stdout), emulated_cluster=spec.to_dict())))
        except ValueError:  # the job failed, or printed more than the object: show it
            sys.stdout.write(proc.stdout)
            return proc.returncode or 1
    return proc.returncode


def _link(matrix: np.ndarray, i: int, j: int) -> float:
    return float(min(matrix[i, j], matrix[j, i]))


def _rate(bytes_per_second: float) -> str:
    """Bits per second in tc's units, three significant digits."""
    return format_rate(float(f"{bytes_per_second * 8:.3g}"))


def _matrix_lines(matrix: np.ndarray, nbytes: int, seconds: float) -> List[str]:
    n = matrix.shape[0]
    lines = [f"bandwidth from row to column ({_size(nbytes)} transfers, "
             f"{seconds:.1f} s; shm: same host, not measured):"]
    cells = [["" if i == j else "shm" if np.isnan(matrix[i, j]) else _rate(matrix[i, j])
              for j in range(n)] for i in range(n)]
    width = max([len(c) for row in cells for c in row] + [len(str(n - 1)), 3])
    lines.append(" " * 6 + " ".join(f"{j:>{width}}" for j in range(n)))
    for i, row in enumerate(cells):
        lines.append(f"{i:>5} " + " ".join(f"{c if c else '-':>{width}}" for c in row))
    return lines


def _median_rates(report: TopologyReport) -> Optional[Tuple[float, float]]:
    """Median bytes/s of the measured links between hosts of one rack and across racks;
    ``None`` without a probe or with one rack."""
    t, m = report.measured.topology, report.matrix
    if m is None or t.n_racks < 2:
        return None
    racks = np.asarray(t.racks)
    hosts = np.asarray(t.hosts)
    links = np.fmin(m, m.T)
    inside = links[(racks[:, None] == racks[None, :]) & (hosts[:, None] != hosts[None, :])]
    across = links[racks[:, None] != racks[None, :]]
    if not across.size:
        return None
    nic = float(np.median(inside)) if inside.size else float(np.nanmax(links))
    return nic, float(np.median(across))


def _suggested(report: TopologyReport) -> Optional[Tuple[int, int]]:
    """``(intra_phases, cross_ranks)`` the cost model draws from the median rates."""
    medians = _median_rates(report)
    if medians is None:
        return None
    return default_rotation_parameters(report.measured.topology, medians[0] * 8,
                                       medians[1] * 8)


def _suggestion(report: TopologyReport) -> Optional[str]:
    """The rotation parameters the measured rates call for (cost model), if racks > 1."""
    medians, suggested = _median_rates(report), _suggested(report)
    if medians is None:
        return None
    return (f"median rates: {_rate(medians[0])} inside a rack, {_rate(medians[1])} across; "
            f"the cost model suggests DSSync(intra_phases={suggested[0]}, "
            f"cross_ranks={suggested[1]})")


def _settings_lines(report: TopologyReport) -> List[str]:
    """:func:`settings` as lines to copy into each host's environment."""
    values = settings(report)
    t = report.measured.topology
    lines = ["to give hvdx this topology on a real cluster, set on each host:"]
    for i, (group, rack) in enumerate(zip(t.host_groups(), values["HVDX_RACK"])):
        name = f"{report.host_names[i]}; " if report.host_names else ""
        lines.append(f"  host {i} ({name}ranks {_ranks(group)}): HVDX_RACK={rack}")
    source = values["link_rates_source"]
    if values["HVDX_LINK_RATES"] is not None:
        why = "the probe's medians inside a rack and across" if source == "probe" \
            else f"as read from {source}"
        medians = _median_rates(report)
        if source != "probe" and medians is not None:
            why += f"; the probe measured {_rate(medians[0])},{_rate(medians[1])}"
        lines.append(f"  every host: HVDX_LINK_RATES={values['HVDX_LINK_RATES']} ({why})")
    elif t.n_racks < 2:
        lines.append("  HVDX_LINK_RATES: not needed with one rack")
    else:
        lines.append("  HVDX_LINK_RATES: not known; --probe measures it")
    return lines


def _exact_rate(bits_per_second: int) -> str:
    """A rate in tc's units that parses back to ``bits_per_second`` exactly, as
    :func:`hvdx.strategies.dssync.spec.parse_link_rates` reads it (``int`` of the parsed float)."""
    text = format_rate(bits_per_second)
    return text if int(parse_rate(text)) == bits_per_second else f"{bits_per_second}bit"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _ranks(group: Sequence[int]) -> str:
    return " ".join(map(str, group))
