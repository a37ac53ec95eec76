"""``hvdx plan``'s flags read into the cost model's terms: the cluster (a preset with the
flags given applied, :func:`build_cluster`), the workload (:func:`build_workload`), the
strategy options (:func:`strategy_options`) and the measured local steps and waits
(:func:`local_steps`, :func:`local_waits`, :func:`local_cores`); a message of the model's
that names a field names the flag instead (:func:`in_flag_terms`).
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Dict, Optional

from hvdx.core.cost_model import Cluster, Workload, parse_rate, parse_time
from hvdx.core.units import parse_count

__all__ = ["PRESETS", "build_cluster", "build_workload", "in_flag_terms", "local_cores",
           "local_steps", "local_waits", "parse_params", "plan_options", "strategy_options"]

#: Clusters by name; flags given explicitly override them.
PRESETS: Dict[str, Dict[str, object]] = {
    # What hvdx.cluster emulates by default: 2 racks x 2 hosts behind a slow core link.
    "emulated": {"racks": 2, "hosts_per_rack": 2, "nic": "1gbit", "uplink": "100mbit"},
    # 8 racks x 32 single-GPU hosts, 25 Gbit NICs, 4:1 oversubscribed uplinks.
    "datacenter": {"racks": 8, "hosts_per_rack": 32, "nic": "25gbit", "oversubscription": 4.0},
}


def parse_params(text: str) -> float:
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
            own checks name its fields: see :func:`in_flag_terms`).
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


def local_cores(given: Optional[int]) -> int:
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


def plan_options():
    """The strategy options of the built-in strategies (their descriptors'
    ``plan_options``), in catalogue order."""
    from hvdx.strategies.catalogue import BUILT_IN

    return [option for entry in BUILT_IN for option in entry.plan_options]


def strategy_options(args: argparse.Namespace) -> Dict[str, object]:
    """The strategy options given or defaulted, by the cost model's names."""
    options = {}
    for option in plan_options():
        if getattr(args, option.dest) is not None:
            options[option.dest] = getattr(args, option.dest)
    return options


#: The name the cluster, the workload or a strategy option gives a flag's value at the
#: start of its message: ``Cluster.racks=0 ...``, ``cross_ranks=99 ...``.
_FIELD_RE = re.compile(r"^(?:Cluster\.|Workload\.)?([a-z_]+)=")


def in_flag_terms(message: str, args: argparse.Namespace) -> str:
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

