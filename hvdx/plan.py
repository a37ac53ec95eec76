"""``hvdx plan``: which strategy should win on this network, before any run.

Prices one step of every strategy with the alpha-beta model of
:mod:`hvdx.core.cost_model` and prints a table and a verdict; ``--sweep`` repeats that
for several uplink rates (or oversubscription ratios) and prints the winner at each.
The numbers are predictions, to be checked against measured runs. Strategies the model
prices but hvdx does not implement (:data:`MODEL_ONLY`) are marked "(model only)".

Example::

    hvdx plan --preset datacenter --params 138e6 --fc-fraction 0.9 --compute-ms 100
    hvdx plan --preset emulated --sweep 10mbit,100mbit,1gbit
    hvdx plan --preset emulated --json
    mpirun -n 4 hvdx plan --calibrate calibration.json     # measure, on the cluster
    hvdx plan --racks 2 --hosts-per-rack 2 --nic 1gbit --uplink 100mbit \
        --calibration calibration.json --params 1.37e6 --compute-ms 30

``--calibrate FILE``, run as an MPI job over the cluster's hosts, times exchange rounds
on each link class (:mod:`hvdx.mpi.calibrate`) and writes them to FILE;
``--calibration FILE`` prices every strategy from those measurements instead of the
rates and ``--latency`` (:class:`hvdx.core.calibration.Calibration`), with an
allreduce laid out as the MPI library runs it. The cluster flags must describe the
cluster the file was measured on. ``--local-steps horovod=140ms,topk=135ms,...`` gives
each strategy's step measured with every rank on one host (``hvdx bench --localhost``),
which then replaces ``--compute-ms`` for it: the phases are added to it.
``--local-waits topk=35ms,...`` gives the part of each such step its ranks spent waiting
in hvdx's own exchanges (``hvdx_wait_s`` in ``hvdx bench``'s results), and
``--local-cores`` the cores its ranks shared: with more ranks than cores, the earlier
ranks' share of the wire crosses during that wait, and is not added again
(:func:`hvdx.core.cost_model.predict`).

Under the table, each row's ``to run`` line is what a script writes to get it: the
argument of ``DistributedOptimizer`` (``HVDX_COMPRESSION`` / ``HVDX_SYNC`` take the same
call), and the preset (``HVDX_COMPRESSION=fast``) where one sends the same bytes.

``--json`` prints one object built from the same figures as the text, which rounds
them; its keys are :data:`JSON_KEYS` (also the epilog of ``hvdx plan --help``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from hvdx.cli_help import DefaultsHelpFormatter
from hvdx.core.cost.verdict import PLAN_TOLERANCE, compute_bound, tied, wire_share
from hvdx.core.cost_model import (
    DEFAULT_STRATEGIES,
    PLACEMENTS,
    Cluster,
    Prediction,
    Workload,
    compare,
    format_rate,
    parse_rate,
    parse_time,
    predict,
    speedup,
)
from hvdx.core.units import format_time, parse_count

__all__ = ["JSON_KEYS", "MODEL_ONLY", "PRESETS", "add_arguments", "build_cluster",
           "build_workload", "local_steps", "local_waits", "main", "render", "report",
           "run_line", "run_plan"]

#: Clusters by name; flags given explicitly override them.
PRESETS: Dict[str, Dict[str, object]] = {
    # What hvdx.cluster emulates by default: 2 racks x 2 hosts behind a slow core link.
    "emulated": {"racks": 2, "hosts_per_rack": 2, "nic": "1gbit", "uplink": "100mbit"},
    # 8 racks x 32 single-GPU hosts, 25 Gbit NICs, 4:1 oversubscribed uplinks.
    "datacenter": {"racks": 8, "hosts_per_rack": 32, "nic": "25gbit", "oversubscription": 4.0},
}

#: Strategies of the cost model that hvdx does not implement, priced for comparison only:
#: a rack-level hierarchical allreduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE is per
#: host, not per rack). Every other key of the model is something hvdx (or Horovod) runs.
MODEL_ONLY = frozenset({"hierarchical"})

#: The keys of ``--json``'s object, for the docs and ``--help``.
JSON_KEYS = (
    "--json keys: 'cluster' (racks, hosts_per_rack, ranks_per_host, ranks, nic_bps and "
    "uplink_bps in bits/s, oversubscription, latency_s, intra_host_bps (null: not a "
    "bottleneck), placement, calibration (where --calibration was measured, or null)); 'workload' (params, fc_params, bytes_per_element, "
    "compute_ms, batch_size, activation_size); without --sweep, 'strategies': the table's "
    "rows, fastest first, each with strategy (the cost model's key), label, model_only, "
    "step_ms, compute_ms (the compute or --local-steps' step it holds), comm_ms, hidden_ms (of comm_ms, what runs inside --local-waits), "
    "mb_per_rank_per_step, bottleneck, vs_horovod (speedup per batch), "
    "data_ranks (ranks that train) and run (what a script writes to run it, as the text's "
    "'to run' lines; null for a model-only strategy), and 'verdict': label, strategy, vs_horovod, "
    "step_ms and bottleneck of the fastest hvdx strategy, faster_model_only (labels "
    "of model-only strategies predicted faster still), tied (labels of the strategies "
    "within the plan's 20% error of it per batch), wire_share (of its step, the wire "
    "nothing hides) and compute_bound (wire_share under 25%: with any tie, the text "
    "then calls no winner); with --sweep, 'sweep': one entry "
    "per point with uplink_bps, oversubscription, strategies (rows as above, in the "
    "table's order) and winner (as verdict).")

_DEFAULT_SWEEP = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``hvdx plan`` flags to ``parser``."""
    net = parser.add_argument_group("cluster (a preset, overridden by any flag given)")
    net.add_argument("--preset", choices=sorted(PRESETS), default="datacenter",
                     help="base cluster")
    net.add_argument("--racks", type=int, help="number of racks (default: from --preset)")
    net.add_argument("--hosts-per-rack", type=int,
                     help="hosts per rack (default: from --preset)")
    net.add_argument("--ranks-per-host", type=int, default=1, help="ranks (GPUs) per host")
    net.add_argument("--nic", metavar="RATE",
                     help="host NIC rate, e.g. 25gbit (default: from --preset)")
    net.add_argument("--uplink", metavar="RATE",
                     help="rack uplink rate, e.g. 100mbit (default: from --preset)")
    net.add_argument("--oversubscription", type=float,
                     help="hosts_per_rack * nic / uplink, e.g. 4, instead of --uplink "
                          "(default: from --preset)")
    net.add_argument("--latency", metavar="TIME", default="25us",
                     help="per-message latency alpha, with its unit: 25us, 5ms, 0.005s "
                          "(a bare number is seconds; 1 or more is refused as a "
                          "forgotten unit)")
    net.add_argument("--intra-host", metavar="RATE",
                     help="rate between ranks of one host (default: not a bottleneck)")
    net.add_argument("--placement", choices=PLACEMENTS, default="blocked",
                     help="how ranks fill the hosts: blocked (rack by rack) or "
                          "interleaved (one host of each rack in turn: rank r in rack "
                          "r mod racks, so the long hops of the exponential graphs stay "
                          "inside racks)")
    # String defaults go through `type` too: the help shows 138e6, the value is a float.
    work = parser.add_argument_group("workload (the defaults are VGG-16)")
    work.add_argument("--params", type=_params, metavar="COUNT", default="138e6",
                      help="parameters, e.g. 138M, 1.37e6 (K, M, G: 1e3, 1e6, 1e9)")
    work.add_argument("--fc-fraction", type=float, default=0.9,
                      help="share of parameters in FC layers")
    work.add_argument("--compute-ms", type=float, default=100.0,
                      help="compute per step on one rank, ms")
    work.add_argument("--bytes-per-element", type=int, default=4,
                      help="bytes per parameter, 4 for float32")
    work.add_argument("--batch-size", type=int, default=32, help="samples per rank")
    work.add_argument("--activation-size", type=int, default=25088,
                      help="elements per sample at the conv/FC boundary")
    work.add_argument("--fc-compute-fraction", type=float, default=0.01,
                      help="share of compute in the FC layers")
    opts = parser.add_argument_group("strategy options")
    for option in _plan_options():  # each strategy's, from the catalogue
        opts.add_argument(option.flag, type=option.type, default=option.default,
                          help=option.help)
    parser.add_argument("--sweep", nargs="?", const="default", metavar="VALUES",
                        help="comma-separated uplink rates (100mbit,1gbit) or oversubscription "
                             "ratios (1,4,16); alone: ratios 1 to 64 (default: no sweep)")
    cal = parser.add_argument_group("calibration (measured on the actual cluster)")
    cal.add_argument("--calibrate", metavar="FILE",
                     help="run as an MPI job on the cluster (mpirun -n N hvdx plan "
                          "--calibrate FILE): time exchange rounds on every link class "
                          "and write them to FILE, then stop (default: no calibration run)")
    cal.add_argument("--calibration", metavar="FILE",
                     help="price every strategy from the rounds measured in FILE (written "
                          "by --calibrate on this cluster) instead of the rates and "
                          "--latency (default: none: the rates alone)")
    cal.add_argument("--local-steps", metavar="KEY=TIME,...",
                     help="each strategy's step measured with every rank on one host "
                          "(e.g. horovod=131ms,topk=142ms; `hvdx bench --localhost` "
                          "measures them): it replaces the modelled compute, and the "
                          "cluster's phases are added to it (default: none: the compute)")
    cal.add_argument("--local-waits", metavar="KEY=TIME,...",
                     help="of each --local-steps step, the time its ranks waited in hvdx's "
                          "exchanges (e.g. topk=35ms; hvdx_wait_s in `hvdx bench`'s results): "
                          "with more ranks than --local-cores, the earlier ranks' share of "
                          "the wire crosses during it and is not added again (default: "
                          "none: the phases are added whole)")
    cal.add_argument("--local-cores", metavar="N", type=int,
                     help="the cores the ranks of the --local-waits runs shared (default: "
                          "this machine's)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the text: the same figures, "
                             "unrounded (keys below)")


def _params(text: str) -> float:
    """``--params``: a count with K, M or G as rates take them (``100M``), at least 1.

    Raises:
        argparse.ArgumentTypeError: saying what to write (argparse names the flag).
    """
    try:
        params = parse_count(text, "--params")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a count: write a number, optionally with K, M or G "
            "(1e3, 1e6, 1e9), e.g. 138M") from None
    if params < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1: the model's "
                                         "parameters, e.g. 138M")
    return params


def build_cluster(args: argparse.Namespace) -> Cluster:
    """The preset's cluster with every explicitly given flag applied."""
    base = dict(PRESETS[args.preset])
    for key in ("racks", "hosts_per_rack", "nic", "uplink", "oversubscription"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    if args.uplink is not None and args.oversubscription is not None:
        raise ValueError(f"--uplink={args.uplink!r} and --oversubscription="
                         f"{args.oversubscription!r}: give one of them")
    if args.uplink is not None or args.oversubscription is not None:
        base.pop("oversubscription" if args.uplink is not None else "uplink", None)
    extra = {"ranks_per_host": args.ranks_per_host,
             "latency_s": _latency(args.latency),
             "intra_host_bps": None if args.intra_host is None
             else parse_rate(args.intra_host, "--intra-host"),
             "placement": args.placement}
    nic = parse_rate(base["nic"], "--nic")
    extra["calibration"] = _calibration(args)
    if "oversubscription" in base:
        return Cluster.from_oversubscription(base["racks"], base["hosts_per_rack"], nic,
                                             base["oversubscription"], **extra)
    return Cluster(racks=base["racks"], hosts_per_rack=base["hosts_per_rack"], nic_bps=nic,
                   uplink_bps=parse_rate(base["uplink"], "--uplink"), **extra)


#: The least bare number ``--latency`` refuses: a second per message is no network's
#: latency, so ``--latency 5`` is ``5ms`` or ``5us`` with the unit left out.
_BARE_LATENCY_LIMIT_S = 1.0


def _latency(text: str) -> float:
    """``--latency`` in seconds: a duration with its unit, or a bare number of seconds
    below :data:`_BARE_LATENCY_LIMIT_S`.

    Raises:
        ValueError: naming the flag and the value, for what is not a duration or is a
            bare number of a second or more, with what to write instead.
    """
    seconds = parse_time(text, "--latency")
    if _bare_number(text) and seconds >= _BARE_LATENCY_LIMIT_S:
        raise ValueError(f"--latency={text!r} has no unit, so it reads as {seconds:g} "
                         f"seconds per message, no network's latency: write the unit, "
                         f"e.g. --latency {text.strip()}ms or --latency {text.strip()}us")
    return seconds


def _bare_number(text) -> bool:
    """Whether a flag's value is a number written without a unit (``"5"``, ``"1e-3"``)."""
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return isinstance(text, str)


def _calibration(args: argparse.Namespace):
    """``--calibration``'s file, read (``None`` without the flag)."""
    path = getattr(args, "calibration", None)
    if path is None:
        return None
    from hvdx.core.calibration import Calibration

    try:
        return Calibration.load(path)
    except ValueError as error:
        raise ValueError(f"--calibration={path!r}: {error}") from None


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload described by the flags.

    Raises:
        ValueError: naming the flag, for a negative ``--compute-ms`` (the workload's
            own checks name its fields: see :func:`_in_flag_terms`).
    """
    if not 0 <= args.compute_ms < math.inf:
        raise ValueError(f"--compute-ms={args.compute_ms!r} must be finite and not "
                         "negative: one rank's compute per step, in ms")
    return Workload.from_total(
        args.params, args.fc_fraction, args.compute_ms / 1e3,
        bytes_per_element=args.bytes_per_element, batch_size=args.batch_size,
        activation_size=args.activation_size, fc_compute_fraction=args.fc_compute_fraction)


def local_steps(text: Optional[str]) -> Dict[str, float]:
    """``--local-steps``: ``"horovod=131ms,topk=0.142"`` as ``{key: seconds}``.

    Raises:
        ValueError: naming the flag and the entry that is not ``KEY=TIME`` with a
            strategy key of :data:`hvdx.core.cost_model.STRATEGIES`.
    """
    return _times_by_strategy(text, "--local-steps")


def local_waits(text: Optional[str], steps: Dict[str, float]) -> Dict[str, float]:
    """``--local-waits``: ``"topk=35ms"`` as ``{key: seconds}``, each part of the
    ``--local-steps`` step ``steps`` gives for its key.

    Raises:
        ValueError: naming the flag and the entry, as :func:`local_steps`, or a wait
            without a local step or longer than it.
    """
    waits = _times_by_strategy(text, "--local-waits")
    for key, wait in waits.items():
        if key not in steps:
            raise ValueError(f"--local-waits {key}={wait:g}s needs --local-steps {key}: "
                             "the wait is part of that measured step")
        if wait > steps[key]:
            raise ValueError(f"--local-waits {key}={wait:g}s is longer than --local-steps "
                             f"{key}={steps[key]:g}s, which holds it")
    return waits


def _local_cores(given: Optional[int]) -> int:
    """``--local-cores``, or this machine's cores where it is not given.

    Raises:
        ValueError: naming the flag, for fewer than one core.
    """
    if given is None:
        from hvdx.info import usable_cores

        return usable_cores()
    if given < 1:
        raise ValueError(f"--local-cores={given} must be at least 1: the cores the ranks "
                         "of the --local-waits runs shared")
    return given


def _times_by_strategy(text: Optional[str], flag: str) -> Dict[str, float]:
    from hvdx.core.cost_model import STRATEGIES

    times: Dict[str, float] = {}
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        key, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or key not in STRATEGIES:
            raise ValueError(f"{flag}={text!r}: {entry.strip()!r} is not KEY=TIME "
                             f"with KEY one of {', '.join(STRATEGIES)}")
        times[key] = parse_time(value, f"{flag} {key}")
    return times


def _plan_options():
    """The strategy options of the built-in strategies (their descriptors'
    ``plan_options``), in catalogue order."""
    from hvdx.strategies.catalogue import BUILT_IN

    return [option for entry in BUILT_IN for option in entry.plan_options]


def _options(args: argparse.Namespace) -> Dict[str, object]:
    """The strategy options given or defaulted, by the cost model's names."""
    options = {}
    for option in _plan_options():
        if getattr(args, option.dest) is not None:
            options[option.dest] = getattr(args, option.dest)
    return options


def report(args: argparse.Namespace) -> Dict[str, object]:
    """The figures for parsed ``hvdx plan`` arguments: what ``--json`` prints
    (:data:`JSON_KEYS`) and :func:`render` writes as text.

    Raises:
        ValueError: naming the flag, for a bad value.
    """
    try:
        return _report(args)
    except ValueError as error:
        raise ValueError(_in_flag_terms(str(error), args)) from None


#: The name the cluster, the workload or a strategy option gives a flag's value at the
#: start of its message: ``Cluster.racks=0 ...``, ``cross_ranks=99 ...``.
_FIELD_RE = re.compile(r"^(?:Cluster\.|Workload\.)?([a-z_]+)=")


def _in_flag_terms(message: str, args: argparse.Namespace) -> str:
    """``message`` with the model's name of a flag's value replaced by the flag
    (``Cluster.racks=0 must be ...`` -> ``--racks=0 must be ...``): the user wrote the
    flag, and the cost model checks the value under its own name. Only a name that is
    a flag's dest is replaced, so the value shown is the one the flag gave (the
    flags whose values are converted, such as ``--compute-ms``, have other names in
    the model and are checked before it)."""
    match = _FIELD_RE.match(message)
    if match is None or match.group(1) not in vars(args):
        return message
    return f"--{match.group(1).replace('_', '-')}={message[match.end():]}"


def _report(args: argparse.Namespace) -> Dict[str, object]:
    cluster, workload, options = build_cluster(args), build_workload(args), _options(args)
    if args.sweep is not None and cluster.calibration is not None:
        raise ValueError(f"--sweep={args.sweep!r} with --calibration: the calibration "
                         "was measured at one uplink rate; sweep without it")
    figures: Dict[str, object] = {"cluster": _cluster_figures(cluster),
                                  "workload": _workload_figures(workload)}
    # A local step does not depend on the links: it holds at every point of a sweep.
    local = local_steps(getattr(args, "local_steps", None))
    waits = local_waits(getattr(args, "local_waits", None), local)
    cores = _local_cores(getattr(args, "local_cores", None)) if waits else None
    if args.sweep is not None:
        figures["sweep"] = [_sweep_point(point, workload, options, local, waits, cores)
                            for point in _sweep_points(args.sweep, cluster)]
    else:
        baseline = predict("horovod", cluster, workload, local.get("horovod"),
                           waits.get("horovod"), cores)
        # Fastest first, as compare() ranks them (a stable sort: ties keep entry order).
        predicted = sorted(_predictions(cluster, workload, options, local, waits, cores),
                           key=lambda pair: pair[0].seconds_per_batch)
        rows = [_row(p, baseline, run) for p, run in predicted]
        figures["strategies"] = rows
        figures["verdict"] = _winner(rows)
    return figures


def render(figures: Dict[str, object]) -> str:
    """The text of :func:`report`'s figures: the cluster, the workload, then the table
    and the verdict, or the sweep and its winners."""
    lines = [_describe(figures["cluster"], figures["workload"])]
    if "sweep" in figures:
        lines += _sweep_lines(figures["sweep"])
        return "\n".join(lines)
    rows = figures["strategies"]
    lines.append(_table(rows))
    lines += _model_only_note(rows)
    stanza = next((r for r in rows if r["strategy"] == "stanza"), None)
    if stanza is not None:
        lines.append(f"(speedups compare time per batch: stanza trains on "
                     f"{stanza['data_ranks']} of {figures['cluster']['ranks']} ranks)")
    lines += _run_lines(rows)
    lines.append(_verdict(figures["verdict"]))
    return "\n".join(lines)


# --- figures ----------------------------------------------------------------------------

def _cluster_figures(c: Cluster) -> Dict[str, object]:
    return {"racks": c.racks, "hosts_per_rack": c.hosts_per_rack,
            "ranks_per_host": c.ranks_per_host, "ranks": c.ranks, "nic_bps": c.nic_bps,
            "uplink_bps": c.uplink_bps, "oversubscription": c.oversubscription,
            "latency_s": c.latency_s, "intra_host_bps": c.intra_host_bps,
            "placement": c.placement,
            "calibration": None if c.calibration is None else c.calibration.source}


def _workload_figures(w: Workload) -> Dict[str, object]:
    return {"params": w.params, "fc_params": w.fc_params,
            "bytes_per_element": w.bytes_per_element, "compute_ms": w.compute_s * 1e3,
            "batch_size": w.batch_size, "activation_size": w.activation_size}


def _row(p: Prediction, baseline: Prediction, run: Optional[str]) -> Dict[str, object]:
    return {"strategy": p.strategy, "label": p.label, "model_only": p.strategy in MODEL_ONLY,
            "step_ms": p.step_s * 1e3, "compute_ms": p.compute_s * 1e3,
            "comm_ms": p.comm_s * 1e3,
            "hidden_ms": p.hidden_s * 1e3,
            "mb_per_rank_per_step": p.bytes_per_rank / 1e6, "bottleneck": p.bottleneck,
            "vs_horovod": speedup(p, baseline), "data_ranks": p.data_ranks, "run": run}


def _predictions(cluster: Cluster, workload: Workload, options: Dict[str, object],
                 local: Dict[str, float], waits: Dict[str, float],
                 cores: Optional[int]) -> List[Tuple[Prediction, Optional[str]]]:
    """``(prediction, to run)`` of every entry of ``DEFAULT_STRATEGIES``, in its order
    (compare() one entry at a time keeps each prediction with its entry's options)."""
    return [(compare(cluster, workload, [entry], local, waits, cores, **options)[0],
             run_line(entry, options, cluster)) for entry in DEFAULT_STRATEGIES]


def run_line(entry, options: Dict[str, object], cluster: Cluster) -> Optional[str]:
    """What a script writes to run the cost model's ``entry`` (a key, or ``(key, own
    options)``) with the shared ``options`` on ``cluster``: the entry point's argument
    (the same call goes in ``HVDX_COMPRESSION`` / ``HVDX_SYNC``), and the TopK preset
    that sends the same bytes; ``None`` for a model-only strategy."""
    from hvdx.strategies.catalogue import BUILT_IN
    from hvdx.strategies.descriptor import load

    name, own = (entry, {}) if isinstance(entry, str) else entry
    given = dict(options, **own)
    if name in MODEL_ONLY:
        return None
    if name == "horovod":
        return "hvd.DistributedOptimizer(optimizer, ...), no hvdx argument (Horovod's own)"
    # Each strategy's own line (its descriptor's plan_line), by its cost model key.
    line = next((d.plan_line for d in BUILT_IN if d.cost_model == name and d.plan_line),
                None)
    return None if line is None else load(line)(given, cluster)


def _dssync_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``dssync``'s line; the model's default crosses with every rank of a rack."""
    cross = given.get("cross_ranks") or cluster.ranks_per_rack
    return (f"sync=hvdx.DSSync(intra_phases={given.get('intra_phases', 1)!r}, "
            f"cross_ranks={cross!r})")


def _decentralized_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``decentralized``'s line: the graph, and the order and mixing period where not
    the defaults."""
    arguments = [repr(given.get("topology", "one-peer-exp"))]
    if given.get("order", "adapt_then_combine") != "adapt_then_combine":
        arguments.append(f"order={given['order']!r}")
    if given.get("mix_every", 1) != 1:
        arguments.append(f"mix_every={given['mix_every']!r}")
    return f"sync=hvdx.Decentralized({', '.join(arguments)})"


def _stanza_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``stanza``'s line: a trainer, in code only."""
    return (f"hvd.Stanza(features, head, optimizer, fc_workers="
            f"{given.get('fc_workers', 1)!r}), in code only")


def _topk_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``topk``'s line; the model's gathered TopK prices the uplink alone (every rank
    computes the downlink), its sharded TopK a downlink of ``ratio`` unless given."""
    from hvdx.strategies.topk.presets import PRESETS as TOPK_PRESETS
    from hvdx.strategies.topk.spec import TopKCompression, topk

    ratio, mode = given.get("ratio", 0.01), given.get("mode", "gathered")
    downlink = given.get("downlink_ratio")  # (the presets': any, where gathered)
    if downlink is None and mode == "sharded":
        downlink = ratio
    arguments = [repr(ratio)] + ([] if downlink is None else [repr(downlink)])
    line = f"compression=hvd.Compression.topk({', '.join(arguments)}, mode={mode!r})"
    if mode != TopKCompression.resolve_mode(topk(), cluster.ranks):  # a preset's: "auto"
        return line
    same = [name for name, preset in TOPK_PRESETS.items() if preset["ratio"] == ratio and
            (mode == "gathered" or preset["downlink_ratio"] == downlink)]
    if not same:
        return line
    return f"{line}, or HVDX_COMPRESSION={' / '.join(same)} (tuned, the same bytes)"


def _winner(rows: List[Dict[str, object]]) -> Dict[str, object]:
    """The fastest strategy hvdx can run (Horovod's own included), and the model-only
    strategies predicted faster still: a verdict must name something one can use."""
    ranked = sorted(rows, key=lambda r: -r["vs_horovod"])  # stable: ties keep row order
    best = next(r for r in ranked if not r["model_only"])
    # Time per batch is proportional to 1 / vs_horovod; the best is first.
    close = tied({r["label"]: 1.0 / r["vs_horovod"] for r in ranked if not r["model_only"]})
    share = wire_share(best["step_ms"], best["compute_ms"])
    return {"label": best["label"], "strategy": best["strategy"],
            "vs_horovod": best["vs_horovod"], "step_ms": best["step_ms"],
            "bottleneck": best["bottleneck"],
            "faster_model_only": [r["label"] for r in ranked
                                  if r["model_only"] and r["vs_horovod"] > best["vs_horovod"]],
            "tied": close[1:], "wire_share": share,
            "compute_bound": compute_bound(best["step_ms"], best["compute_ms"])}


def _sweep_point(cluster: Cluster, workload: Workload, options: Dict[str, object],
                 local: Dict[str, float], waits: Dict[str, float],
                 cores: Optional[int]) -> Dict[str, object]:
    # In DEFAULT_STRATEGIES order: the sweep's table has a row per entry.
    predictions = _predictions(cluster, workload, options, local, waits, cores)
    baseline = next(p for p, _ in predictions if p.strategy == "horovod")
    rows = [_row(p, baseline, run) for p, run in predictions]
    return {"uplink_bps": cluster.uplink_bps, "oversubscription": cluster.oversubscription,
            "strategies": rows, "winner": _winner(rows)}


# --- text -------------------------------------------------------------------------------

def _describe(c: Dict[str, object], w: Dict[str, object]) -> str:
    return (f"cluster: {c['racks']} racks x {c['hosts_per_rack']} hosts x "
            f"{c['ranks_per_host']} rank(s) = {c['ranks']} ranks; NIC "
            f"{format_rate(c['nic_bps'])}, uplink {format_rate(c['uplink_bps'])} "
            f"({c['oversubscription']:g}:1), latency {format_time(c['latency_s'])}, "
            f"{c['placement']} placement\n"
            + (f"calibrated: rounds measured on {c['calibration']}\n"
               if c.get("calibration") is not None else "") +
            f"workload: {w['params'] / 1e6:g}M params ({w['fc_params'] / 1e6:g}M FC), "
            f"{w['bytes_per_element']} B each, compute {w['compute_ms']:g} ms/step, "
            f"batch {w['batch_size']}, activations {w['activation_size']}/sample")


def _label(row: Dict[str, object]) -> str:
    return f"{row['label']} (model only)" if row["model_only"] else row["label"]


def _model_only_note(rows: List[Dict[str, object]]) -> List[str]:
    if not any(r["model_only"] for r in rows):
        return []
    return ["(model only: priced by the cost model for comparison; not an hvdx strategy)"]


def _columns(table: List[List[str]]) -> List[str]:
    """Rows of cells, the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
    return ["  ".join(cell.ljust(width) if j == 0 else cell.rjust(width)
                      for j, (cell, width) in enumerate(zip(row, widths))) for row in table]


def _table(rows: List[Dict[str, object]]) -> str:
    table = [["strategy", "step ms", "comm ms", "MB/rank/step", "bottleneck", "vs horovod"]]
    table += [[_label(r), f"{r['step_ms']:.1f}", f"{r['comm_ms']:.1f}",
               f"{r['mb_per_rank_per_step']:.2f}", r["bottleneck"], f"{r['vs_horovod']:.2f}x"]
              for r in rows]
    return "\n".join(_columns(table))


def _run_lines(rows: List[Dict[str, object]]) -> List[str]:
    """Under the table: each row's label and what a script writes to run it."""
    runnable = [r for r in rows if r["run"] is not None]
    width = max(len(r["label"]) for r in runnable)
    return (["to run (DistributedOptimizer's argument; HVDX_COMPRESSION / HVDX_SYNC take "
             "the same call):"]
            + [f"  {r['label'].ljust(width)}  {r['run']}" for r in runnable])


def _faster_model_only(winner: Dict[str, object]) -> str:
    faster = winner["faster_model_only"]
    return f"; faster in the model only: {', '.join(faster)}" if faster else ""


def _verdict(v: Dict[str, object]) -> str:
    if v["tied"] and v["compute_bound"]:
        names = [v["label"]] + v["tied"]
        return (f"verdict: too close to call between {', '.join(names)} (within "
                f"{PLAN_TOLERANCE:.0%} of the fastest per batch): the step is mostly "
                f"compute (wire {v['wire_share']:.0%} of {v['label']}'s step), so the "
                "ranking rests on each strategy's compute and CPU work, where the plan's "
                "error (a quarter on shared cores) exceeds their differences; time them "
                "on your own job: `hvdx bench --script YOUR_SCRIPT`" + _faster_model_only(v))
    tie = (f"; within the plan's {PLAN_TOLERANCE:.0%} error of it: {', '.join(v['tied'])}"
           if v["tied"] else "")
    if v["strategy"] == "horovod":
        return ("verdict: horovod wins; no hvdx strategy is predicted to pay here"
                + tie + _faster_model_only(v))
    return (f"verdict: {v['label']} wins, {v['vs_horovod']:.2f}x horovod per batch "
            f"({v['step_ms']:.1f} ms/step, bottleneck {v['bottleneck']})"
            + tie + _faster_model_only(v))


def _sweep_lines(points: List[Dict[str, object]]) -> List[str]:
    """One column per sweep point, one row per strategy, then the winner at each point."""
    table = [["uplink"] + [format_rate(p["uplink_bps"]) for p in points],
             ["oversubscription"] + [f"{p['oversubscription']:g}:1" for p in points]]
    for i, first in enumerate(points[0]["strategies"]):
        table.append([f"{_label(first)}, step ms"]
                     + [f"{p['strategies'][i]['step_ms']:.1f}" for p in points])
    lines = _columns(table) + _model_only_note(points[0]["strategies"])
    lines += _run_lines(points[0]["strategies"])
    for p in points:
        w = p["winner"]
        lines.append(f"winner at uplink {format_rate(p['uplink_bps'])} "
                     f"({p['oversubscription']:g}:1): {w['label']}, "
                     f"{w['vs_horovod']:.2f}x horovod per batch" + _faster_model_only(w))
    return lines


def _sweep_uplink(value: str, base: Cluster) -> float:
    """A plain number is an oversubscription ratio, anything else an uplink rate."""
    try:
        ratio = float(value)
    except ValueError:
        return parse_rate(value, "--sweep")
    if not 0 < ratio < math.inf:
        raise ValueError(f"--sweep={value!r} must be a positive ratio (e.g. 4) or a rate")
    return base.hosts_per_rack * base.nic_bps / ratio


def _sweep_points(text: str, base: Cluster) -> List[Cluster]:
    """``base`` with each uplink of the comma-separated ``text`` (``"default"``: 1:1 to 64:1)."""
    values = [f"{v:g}" for v in _DEFAULT_SWEEP] if text == "default" else \
        [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError(f"--sweep={text!r} names no values")
    return [dataclasses.replace(base, uplink_bps=_sweep_uplink(v, base)) for v in values]


def run_plan(args: argparse.Namespace) -> int:
    """Prints the prediction (or the sweep) for parsed ``hvdx plan`` arguments, as text
    or, with ``--json``, as one JSON object.

    Returns:
        0, or 2 after printing the message of a bad value to stderr.
    """
    if getattr(args, "calibrate", None):
        return _run_calibration(args.calibrate)
    try:
        figures = report(args)
    except ValueError as error:
        print(f"hvdx plan: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(figures) if args.json else render(figures))
    return 0


def _run_calibration(path: str) -> int:
    """``--calibrate FILE``: every rank of the MPI job measures; rank 0 writes FILE."""
    from mpi4py import MPI

    from hvdx.mpi.calibrate import calibrate, with_set_averages

    world = MPI.COMM_WORLD
    say = (lambda s: print(s, flush=True)) if world.Get_rank() == 0 else None  # noqa: E731
    if world.Get_size() < 2:
        if say:
            say("hvdx plan: error: --calibrate measures links between ranks: run it as an "
                "MPI job over the cluster's hosts, e.g. mpirun -n 4 -ppn 1 hvdx plan "
                f"--calibrate {path}")
        return 2
    calibration = with_set_averages(calibrate(say=say), say=say)
    if say:
        calibration.save(path)
        say(f"written: {path} ({calibration.source}); use it with hvdx plan --calibration "
            f"{path} and the cluster's flags")
    world.Barrier()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``hvdx plan`` as a program of its own (``python -m hvdx.plan``)."""
    parser = argparse.ArgumentParser(prog="hvdx plan", description=__doc__.splitlines()[0],
                                     epilog=JSON_KEYS, formatter_class=DefaultsHelpFormatter)
    add_arguments(parser)
    return run_plan(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
