"""TopK's line under ``hvdx plan``'s table (its descriptor's ``plan_line``): what a script
writes to run it as the cost model priced it, and the TopK presets that send the same
bytes (:func:`hvdx.planning.run_lines.run_line` calls it).
"""

from __future__ import annotations

from typing import Dict

from hvdx.core.cost_model import Cluster

__all__ = ["topk_line"]


def topk_line(given: Dict[str, object], cluster: Cluster) -> str:
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
