"""Link rates and durations in tc's units, for the cost model and the emulated cluster,
and counts with SI prefixes (``100M`` parameters).

tc counts rates in bits per second with SI prefixes (``100mbit`` = 1e8 bit/s) and
reads a bare number as *bytes* per second, an easy slip: strings must name their unit.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Union

__all__ = ["format_rate", "format_time", "parse_bytes", "parse_count", "parse_quantity",
           "parse_rate", "parse_time"]

Number = Union[int, float]

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
# SI prefixes alone, as rates take them (mbit): a count has no unit to follow them.
_COUNT_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_BYTE_UNITS = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9,
               "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30}
# As tc writes them: the unit follows the number directly; an exponent only without a
# unit (plain seconds or bits per second given as numbers, e.g. "1e-3").
_NUMBER = r"(?:\d+\.?\d*|\.\d+)"
_QUANTITY_RE = re.compile(rf"^\s*(?:({_NUMBER}e[+-]?\d+)|({_NUMBER})([a-z]*))\s*$")


def parse_quantity(value: Union[Number, str], name: str, units: Mapping[str, float],
                   hint: str) -> float:
    """A non-negative number, or a string of a number and one of ``units``.

    Raises:
        ValueError: naming ``name`` and the value, with ``hint`` on what to write.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name}={value!r} is not a number: {hint}")
    if isinstance(value, str):
        match = _QUANTITY_RE.match(value.lower())
        number, unit = (match.group(1), "") if match and match.group(1) else \
            (match.group(2), match.group(3)) if match else (None, None)
        if number is None or unit not in units:
            raise ValueError(f"{name}={value!r} is not understood: {hint}")
        value = float(number) * units[unit]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be finite and not negative: {hint}")
    return float(value)


def parse_rate(value: Union[Number, str], name: str = "rate") -> float:
    """Parses a link rate like tc does (SI units): ``"100mbit"`` -> ``1e8`` bits/s.

    Args:
        value: a string with ``bit``, ``kbit``, ``mbit``, ``gbit`` or ``tbit``, or a number
            of bits per second. A bare number in a string is refused: tc reads it as
            bytes per second, an easy slip.
        name: the argument's name, for the error message.

    Raises:
        ValueError: naming ``name`` and the value, if it is not a positive rate.
    """
    rate = parse_quantity(value, name, _RATE_UNITS, "use a positive rate such as 100mbit or 25gbit")
    if rate == 0:
        raise ValueError(f"{name}={value!r} must be a positive rate, e.g. 100mbit")
    return rate


def parse_time(value: Union[Number, str], name: str = "time") -> float:
    """Parses a duration (``"25us"``, ``"1ms"``, ``"0.5s"`` or seconds) into seconds."""
    return parse_quantity(value, name, _TIME_UNITS, "use a duration such as 25us or 1ms")


def parse_count(value: Union[Number, str], name: str = "count") -> float:
    """Parses a count with an SI prefix, as rates take them: ``"100M"`` -> ``1e8``,
    ``"1.5k"`` -> ``1500``; also ``"138e6"`` or a number. Case is ignored (``m`` is
    mega: a count has no milli).

    Raises:
        ValueError: naming ``name`` and the value, if it is not a count.
    """
    return parse_quantity(value, name, _COUNT_UNITS,
                          "use a number, optionally with K, M or G, e.g. 138M or 1.5G")


def parse_bytes(value: Union[Number, str], name: str = "bytes") -> int:
    """Parses a message size (``"4MiB"``, ``"512kb"``, ``"1e6"``, or a number of bytes).

    Raises:
        ValueError: naming ``name`` and the value, unless it is a whole number of
            bytes, at least 1.
    """
    size = parse_quantity(value, name, _BYTE_UNITS,
                          "use a number of bytes, optionally with kb, mb, kib or mib, e.g. 4MiB")
    if size < 1 or size != int(size):
        raise ValueError(f"{name}={value!r} must be a whole number of bytes, at least 1")
    return int(size)


def format_time(seconds: float) -> str:
    """Renders a duration in the largest unit that keeps it at least 1 (``25e-6`` ->
    ``"25us"``, ``0.005`` -> ``"5ms"``), which :func:`parse_time` reads back."""
    for unit in ("s", "ms"):
        if seconds >= _TIME_UNITS[unit]:
            return f"{seconds / _TIME_UNITS[unit]:g}{unit}"
    return f"{seconds / _TIME_UNITS['us']:g}us"


def format_rate(bits_per_second: float) -> str:
    """Renders a rate in tc's units, e.g. ``2.5e10`` -> ``"25gbit"``."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits_per_second >= _RATE_UNITS[unit]:
            return f"{bits_per_second / _RATE_UNITS[unit]:g}{unit}"
    return f"{bits_per_second:g}bit"
