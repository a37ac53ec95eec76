"""Decentralized SGD's line under ``hvdx plan``'s table (its descriptor's ``plan_line``):
what a script writes to run it as the cost model priced it
(:func:`hvdx.planning.run_lines.run_line` calls it).
"""

from __future__ import annotations

from typing import Dict

from hvdx.core.cost_model import Cluster

__all__ = ["decentralized_line"]


def decentralized_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``decentralized``'s line: the graph, and the order and mixing period where not
    the defaults."""
    arguments = [f"graph={given.get('graph', 'one-peer-exp')!r}"]
    if given.get("order", "adapt_then_combine") != "adapt_then_combine":
        arguments.append(f"order={given['order']!r}")
    if given.get("mix_every", 1) != 1:
        arguments.append(f"mix_every={given['mix_every']!r}")
    return f"sync=hvdx.Decentralized({', '.join(arguments)})"
