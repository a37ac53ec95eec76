"""Argument checks shared by hvdx (the core, the specs): errors that name the argument
and the value."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_integer"]


def check_integer(name: str, value: object, low: int, high: float = math.inf,
                  at_least: str = "of at least") -> int:
    """``value`` as an int from ``low`` to ``high``; ValueError naming ``name`` otherwise.

    The message says ``must be an integer from LOW to HIGH``, or with no ``high``
    ``must be an integer`` followed by ``at_least`` and ``low`` (TopK's specs pass
    ``">="``, the wording their messages have always had). A bool is not an integer
    here; numpy's integers are.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            not low <= value <= high:
        span = f"from {low} to {high}" if high < math.inf else f"{at_least} {low}"
        raise ValueError(f"{name}={value!r} must be an integer {span}")
    return int(value)
