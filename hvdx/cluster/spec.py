"""What an emulated cluster looks like: racks, hosts, link rates, latency, contention.

Standard library only. Every value is checked here, before any namespace exists, and
every error names the argument and the value that was given.

Rates use tc's units (SI: ``1kbit`` is 1000 bit/s). tc's ``kbps``/``mbps`` mean
*bytes* per second, an easy slip, so they are refused rather than guessed at.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple, Union

from hvdx.core import units
from hvdx.core.validation import check_integer

__all__ = [
    "ClusterSpec",
    "ContentionEvent",
    "MAX_HOSTS",
    "add_cluster_arguments",
    "format_rate",
    "parse_contention",
    "parse_rate",
    "parse_time",
]

# The control network is one /24 whose last address belongs to mpiexec's namespace.
MAX_HOSTS = 250

_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_TIME_RE = re.compile(rf"^{_NUMBER}(s|sec|ms|msec|us|usec)?$", re.IGNORECASE)
# tbf cannot shape usefully below a few packets per second, nor above what we can name.
_MIN_RATE = 8 * 10**3
_MAX_RATE = 400 * 10**9

Rate = Union[int, float, str]
Time = Union[int, float, str]


def parse_rate(value: Rate, name: str = "rate") -> int:
    """Parses a link rate into bits per second, within what tbf can shape.

    Args:
        value: ``"500kbit"``, ``"100mbit"``, ``"1.5gbit"`` (tc's SI units, parsed by
            :func:`hvdx.core.units.parse_rate`), or a positive number of bits per second.
        name: the argument's name, for the error message.

    Returns:
        The rate in bits per second, rounded to an integer.

    Raises:
        ValueError: if ``value`` is not a rate between 8kbit and 400gbit.
    """
    hint = "use a number with kbit, mbit or gbit, e.g. 100mbit"
    try:
        bits = units.parse_rate(value, name)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a rate: {hint}") from None
    if not _MIN_RATE <= bits <= _MAX_RATE:
        raise ValueError(f"{name}={value!r} is out of range: rates go from 8kbit to 400gbit")
    return int(round(bits))


def format_rate(bits_per_second: int) -> str:
    """Renders bits per second in tc's units, exactly (``50000000`` -> ``"50mbit"``)."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_second % scale == 0:
            return f"{bits_per_second // scale}{unit}"
    return f"{bits_per_second}bit"


def parse_time(value: Time, name: str = "time") -> float:
    """Parses a duration into seconds.

    Args:
        value: ``"1ms"``, ``"250us"``, ``"2s"`` (tc's units), or a number of seconds
            (a bare number in a string counts as seconds too).
        name: the argument's name, for the error message.

    Returns:
        The duration in seconds.

    Raises:
        ValueError: if ``value`` is not a non-negative duration.
    """
    hint = "use a number with s, ms or us, e.g. 1ms"
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a time: {hint}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _TIME_RE.match(value.strip())
        if not match:
            raise ValueError(f"{name}={value!r} is not a time: {hint}")
        seconds = float(match.group(1)) * _TIME_UNITS[(match.group(2) or "s").lower()]
    else:
        raise ValueError(f"{name}={value!r} is not a time: {hint}")
    if not 0.0 <= seconds < 86400.0:
        raise ValueError(f"{name}={value!r} is out of range: times go from 0 to one day")
    return seconds


@dataclass(frozen=True)
class ContentionEvent:
    """One link slowed to ``rate`` at ``at`` seconds, restored at ``until`` if given.

    Attributes:
        target: ``"h<i>"`` (host i's NIC, both directions), ``"uplink<j>"`` (rack j's
            uplink to the core) or ``"uplink"`` (every rack's uplink).
        rate: the reduced rate, bits per second (strings such as ``"10mbit"`` accepted).
        at: seconds after the contention timer starts.
        until: seconds after the timer starts at which the configured rate comes
            back; ``None`` keeps the reduced rate to the end of the run.
    """

    target: str
    rate: Rate
    at: Time = 0.0
    until: Optional[Time] = None

    def __post_init__(self):
        if not isinstance(self.target, str) or not re.match(r"^(h\d+|uplink\d*)$", self.target):
            raise ValueError(
                f"contention target={self.target!r} is not a link: use h<i> for host i's "
                "NIC, uplink<j> for rack j's uplink, or uplink for every uplink")
        object.__setattr__(self, "rate", parse_rate(self.rate, "contention rate"))
        object.__setattr__(self, "at", parse_time(self.at, "contention at"))
        if self.until is not None:
            until = parse_time(self.until, "contention until")
            if until <= self.at:
                raise ValueError(f"contention until={self.until!r} must come after "
                                 f"at={self.at!r}")
            object.__setattr__(self, "until", until)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready form that :meth:`ClusterSpec.from_dict` reads back."""
        out = {"target": self.target, "rate": format_rate(self.rate), "at": self.at}
        if self.until is not None:
            out["until"] = self.until
        return out


def parse_contention(text: str) -> ContentionEvent:
    """Parses the flag form ``TARGET=RATE@AT[-UNTIL]``, e.g. ``uplink=10mbit@5-15``.

    Raises:
        ValueError: naming ``--contention`` and the text, if it does not have that form.
    """
    match = re.match(r"^([^=@]+)=([^=@]+)@([^-]+)(?:-(.+))?$", text.strip()) \
        if isinstance(text, str) else None
    if not match:
        raise ValueError(
            f"--contention={text!r} is not a contention event: use TARGET=RATE@AT[-UNTIL] "
            "with times in seconds, e.g. uplink=10mbit@5-15 or h1=50mbit@2")
    target, rate, at, until = match.groups()
    return ContentionEvent(target.strip(), rate.strip(), at.strip(),
                           until.strip() if until else None)


@dataclass(frozen=True)
class ClusterSpec:
    """An emulated cluster: ``racks`` x ``hosts_per_rack`` hosts behind shaped links.

    Rates and times may be given as strings (``"200mbit"``, ``"1ms"``); after
    construction they are bits per second (int) and seconds (float).

    Attributes:
        racks: number of racks (each a switch; racks meet at one core switch).
        hosts_per_rack: hosts per rack.
        nic: each host's NIC rate, both directions.
        uplink: each rack's uplink to the core, both directions: the inter-rack
            bottleneck.
        latency: one-way delay added as traffic leaves each host (so a host-to-host
            round trip gains twice this), or ``None``.
        uplink_latency: one-way delay added as traffic leaves each rack, or ``None``.
        contention: links slowed during the run (see :class:`ContentionEvent`).
    """

    racks: int = 2
    hosts_per_rack: int = 2
    nic: Rate = "1gbit"
    uplink: Rate = "100mbit"
    latency: Optional[Time] = None
    uplink_latency: Optional[Time] = None
    contention: Tuple[ContentionEvent, ...] = field(default_factory=tuple)

    def __post_init__(self):
        check_integer("racks", self.racks, 1, MAX_HOSTS)
        check_integer("hosts_per_rack", self.hosts_per_rack, 1, MAX_HOSTS)
        if self.racks * self.hosts_per_rack > MAX_HOSTS:
            raise ValueError(f"racks={self.racks} x hosts_per_rack={self.hosts_per_rack} "
                             f"is more than {MAX_HOSTS} hosts")
        # Frozen dataclass: normalised values are written past its __setattr__.
        object.__setattr__(self, "nic", parse_rate(self.nic, "nic"))
        object.__setattr__(self, "uplink", parse_rate(self.uplink, "uplink"))
        for key in ("latency", "uplink_latency"):
            value = getattr(self, key)
            object.__setattr__(self, key, None if value is None else parse_time(value, key))
        events = self.contention
        if isinstance(events, (str, bytes, dict)) or not isinstance(events, Iterable):
            raise ValueError(f"contention={events!r} must be a list of contention events")
        object.__setattr__(self, "contention", tuple(self._event(e) for e in events))

    def _event(self, event: Any) -> ContentionEvent:
        if isinstance(event, str):
            event = parse_contention(event)
        elif isinstance(event, dict):
            unknown = set(event) - {"target", "rate", "at", "until"}
            if unknown or not {"target", "rate"} <= set(event):
                raise ValueError(f"contention event {event!r} needs keys target, rate and "
                                 "optionally at, until (seconds)")
            event = ContentionEvent(**event)
        elif not isinstance(event, ContentionEvent):
            raise ValueError(f"contention event {event!r} is not a contention event")
        index = re.sub(r"^\D+", "", event.target)
        if event.target.startswith("h") and int(index) >= self.num_hosts:
            raise ValueError(f"contention target={event.target!r} names no host: hosts are "
                             f"h0 to h{self.num_hosts - 1}")
        if event.target.startswith("uplink") and index and int(index) >= self.racks:
            raise ValueError(f"contention target={event.target!r} names no rack: racks are "
                             f"0 to {self.racks - 1}")
        return event

    @property
    def num_hosts(self) -> int:
        """All hosts in the cluster."""
        return self.racks * self.hosts_per_rack

    def rack_of(self, host: int) -> int:
        """The rack of host ``host`` (hosts are numbered rack by rack)."""
        return host // self.hosts_per_rack

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready form (rates in tc units) that :meth:`from_dict` reads back."""
        return {
            "racks": self.racks,
            "hosts_per_rack": self.hosts_per_rack,
            "nic": format_rate(self.nic),
            "uplink": format_rate(self.uplink),
            "latency": self.latency,
            "uplink_latency": self.uplink_latency,
            "contention": [e.to_dict() for e in self.contention],
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str = "cluster spec") -> "ClusterSpec":
        """Builds a spec from a mapping with the field names as keys.

        Raises:
            ValueError: on an unknown key (naming it and ``source``) or a bad value.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be a JSON object, not {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{source} has unknown key(s) {', '.join(unknown)}; known keys "
                             f"are {', '.join(sorted(names))}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str) -> "ClusterSpec":
        """Reads a JSON spec file, e.g. ``{"racks": 2, "nic": "1gbit", ...}``.

        Raises:
            ValueError: if the file cannot be read or parsed, or holds a bad value.
        """
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"cluster spec file {path!r} cannot be read: {error}") from None
        return cls.from_dict(data, source=f"cluster spec file {path!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ClusterSpec":
        """Builds a spec from flags added by :func:`add_cluster_arguments`.

        A ``--cluster-spec`` file gives the base; flags given explicitly override it.
        """
        data: Dict[str, Any] = {}
        if getattr(args, "cluster_spec", None):
            data = cls.from_file(args.cluster_spec).to_dict()
        for name in ("racks", "hosts_per_rack", "nic", "uplink", "latency",
                     "uplink_latency"):
            value = getattr(args, name, None)
            if value is not None:
                data[name] = value
        if getattr(args, "contention", None):
            data["contention"] = list(args.contention)
        return cls.from_dict(data, source="cluster flags")

    @classmethod
    def from_flags(cls, argv: Sequence[str]) -> "ClusterSpec":
        """Parses command-line flags (see :func:`add_cluster_arguments`) into a spec."""
        parser = argparse.ArgumentParser(add_help=False)
        add_cluster_arguments(parser)
        args, rest = parser.parse_known_args(list(argv))
        if rest:
            raise ValueError(f"cluster flags: unknown argument(s) {' '.join(rest)}")
        return cls.from_args(args)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--racks``, ``--hosts-per-rack``, ``--nic``, ``--uplink``, ``--latency``,
    ``--uplink-latency``, ``--contention`` (repeatable) and ``--cluster-spec FILE``.

    Values stay strings here so that :meth:`ClusterSpec.from_args` reports them with the
    argument's name; defaults are ``None`` so that a spec file's values survive.
    """
    def count(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None

    # The defaults shown are ClusterSpec's, for flags given neither here nor in the file.
    d = ClusterSpec()
    group = parser.add_argument_group(
        "emulated cluster", "a flag given here wins over --cluster-spec's value, which wins "
                            "over the default shown")
    group.add_argument("--cluster-spec", metavar="FILE",
                       help="JSON cluster spec file (default: none)")
    group.add_argument("--racks", type=count, help=f"number of racks (default: {d.racks})")
    group.add_argument("--hosts-per-rack", type=count,
                       help=f"hosts per rack (default: {d.hosts_per_rack})")
    group.add_argument("--nic", metavar="RATE",
                       help=f"host NIC rate, e.g. 100mbit (default: {format_rate(d.nic)})")
    group.add_argument("--uplink", metavar="RATE",
                       help=f"rack uplink rate, e.g. 10mbit (default: {format_rate(d.uplink)})")
    group.add_argument("--latency", metavar="TIME",
                       help="one-way delay per host, e.g. 1ms (default: none)")
    group.add_argument("--uplink-latency", metavar="TIME",
                       help="one-way delay per rack, e.g. 5ms (default: none)")
    group.add_argument("--contention", metavar="TARGET=RATE@AT[-UNTIL]", action="append",
                       help="slow a link during the run, e.g. uplink=10mbit@5-15; repeatable "
                            "(default: none)")

