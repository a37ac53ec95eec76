"""How long a benchmark has left: estimates per stage, corrected by the stages done.

A benchmark is a fixed sequence of stages (the calibration, each strategy's local run,
each cluster run). Before it starts, each stage gets an estimate in seconds; as stages
finish, the estimates of the stages left are scaled by how long the finished stages
took against their own estimates, so a machine twice as slow as assumed soon reads
twice as long. Steps:

1. :class:`TimeLeft` takes the stages' estimates, in run order;
2. :meth:`TimeLeft.start` marks the next stage begun, :meth:`TimeLeft.finish` ended
   (its actual seconds recorded);
3. :meth:`TimeLeft.left_s` is the estimates left times ``sum(actual) / sum(estimated)``
   over the finished stages (1 before any), less the time the current stage has run.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence

__all__ = ["TimeLeft", "format_duration"]


def format_duration(seconds: float) -> str:
    """``"40 s"`` under two minutes, ``"7 min"`` beyond, ``"1 h 05 min"`` beyond an hour."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class TimeLeft:
    """The stages of a run and what they have left, from estimates in seconds."""

    def __init__(self, estimates: Sequence[float],
                 clock: Callable[[], float] = time.monotonic):
        if any(e < 0 for e in estimates):
            raise ValueError(f"estimates={list(estimates)!r}: each must be >= 0 seconds")
        self.estimates: List[float] = [float(e) for e in estimates]
        self.actual: List[float] = []
        self.clock = clock
        self.t0 = self.began = clock()
        self._stage_began: Optional[float] = None

    @property
    def done(self) -> int:
        """Stages finished."""
        return len(self.actual)

    def start(self) -> None:
        """The next stage begins now."""
        self._stage_began = self.clock()

    def finish(self) -> None:
        """The stage begun last (or, if none was begun, the time since the last one
        ended) is done."""
        if self.done >= len(self.estimates):
            raise ValueError(f"all {len(self.estimates)} stages are already finished")
        now = self.clock()
        begun = self._stage_began if self._stage_began is not None else self.began
        self.actual.append(now - begun)
        self._stage_began = None
        self.began = now

    def pace(self) -> float:
        """Actual over estimated seconds of the finished stages (1 before any)."""
        estimated = sum(self.estimates[:self.done])
        return sum(self.actual) / estimated if estimated > 0 else 1.0

    def left_s(self) -> float:
        """Seconds the stages not finished have left."""
        left = sum(self.estimates[self.done:]) * self.pace()
        if self._stage_began is not None:
            left -= self.clock() - self._stage_began
        return max(0.0, left)

    def elapsed_s(self) -> float:
        """Seconds since the first stage could begin."""
        return self.clock() - self.t0

    def line(self) -> str:
        """``"4 min in, about 6 min left"``."""
        return (f"{format_duration(self.elapsed_s())} in, "
                f"about {format_duration(self.left_s())} left")
