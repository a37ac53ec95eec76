"""Argument checks shared by hvdx (the core, the specs): errors that name the argument
and the value."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_integer"]


def check_integer(name: str, value: object, low: int, high: float = math.inf) -> int:
    """``value`` as an int from ``low`` to ``high``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not low <= value <= high:
        span = f"from {low} to {high}" if high < math.inf else f"of at least {low}"
        raise ValueError(f"{name}={value!r} must be an integer {span}")
    return int(value)
