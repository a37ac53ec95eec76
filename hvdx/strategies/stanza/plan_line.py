"""Stanza's line under ``hvdx plan``'s table (its descriptor's ``plan_line``): what a
script writes to run it as the cost model priced it
(:func:`hvdx.planning.run_lines.run_line` calls it).
"""

from __future__ import annotations

from typing import Dict

from hvdx.core.cost_model import Cluster

__all__ = ["stanza_line"]


def stanza_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``stanza``'s line: a trainer, in code only."""
    return (f"hvd.Stanza(features, head, optimizer, fc_workers="
            f"{given.get('fc_workers', 1)!r}), in code only")
