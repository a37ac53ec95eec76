"""DS-Sync's line under ``hvdx plan``'s table (its descriptor's ``plan_line``): what a
script writes to run it as the cost model priced it
(:func:`hvdx.planning.run_lines.run_line` calls it).
"""

from __future__ import annotations

from typing import Dict

from hvdx.core.cost_model import Cluster

__all__ = ["dssync_line"]


def dssync_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``dssync``'s line; the model's default crosses with every rank of a rack."""
    cross = given.get("cross_ranks") or cluster.ranks_per_rack
    return (f"sync=hvdx.DSSync(intra_phases={given.get('intra_phases', 1)!r}, "
            f"cross_ranks={cross!r})")
