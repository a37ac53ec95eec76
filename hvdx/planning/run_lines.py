"""Under ``hvdx plan``'s table, what a script writes to run each strategy
(:func:`run_line`): the argument of ``DistributedOptimizer`` (``HVDX_COMPRESSION`` /
``HVDX_SYNC`` take the same call), and the TopK preset that sends the same bytes. Each
strategy's line is its descriptor's ``plan_line``, one of the ``*_line`` functions here.
"""

from __future__ import annotations

from typing import Dict, Optional

from hvdx.core.cost_model import Cluster

__all__ = ["MODEL_ONLY", "decentralized_line", "dssync_line", "run_line", "stanza_line",
           "topk_line"]

#: Strategies of the cost model that hvdx does not implement, priced for comparison only:
#: a rack-level hierarchical allreduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE is per
#: host, not per rack). Every other key of the model is something hvdx (or Horovod) runs.
MODEL_ONLY = frozenset({"hierarchical"})


def run_line(entry, options: Dict[str, object], cluster: Cluster) -> Optional[str]:
    """What a script writes to run the cost model's ``entry`` (a key, or ``(key, own
    options)``) with the shared ``options`` on ``cluster``: the entry point's argument
    (the same call goes in ``HVDX_COMPRESSION`` / ``HVDX_SYNC``), and the TopK preset
    that sends the same bytes; ``None`` for a model-only strategy."""
    from hvdx.strategies.catalogue import BUILT_IN
    from hvdx.strategies.descriptor import load

    name, own = (entry, {}) if isinstance(entry, str) else entry
    given = dict(options, **own)
    if name in MODEL_ONLY:
        return None
    if name == "horovod":
        return "hvd.DistributedOptimizer(optimizer, ...), no hvdx argument (Horovod's own)"
    # Each strategy's own line (its descriptor's plan_line), by its cost model key.
    line = next((d.plan_line for d in BUILT_IN if d.cost_model == name and d.plan_line),
                None)
    return None if line is None else load(line)(given, cluster)


def dssync_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``dssync``'s line; the model's default crosses with every rank of a rack."""
    cross = given.get("cross_ranks") or cluster.ranks_per_rack
    return (f"sync=hvdx.DSSync(intra_phases={given.get('intra_phases', 1)!r}, "
            f"cross_ranks={cross!r})")


def decentralized_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``decentralized``'s line: the graph, and the order and mixing period where not
    the defaults."""
    arguments = [repr(given.get("topology", "one-peer-exp"))]
    if given.get("order", "adapt_then_combine") != "adapt_then_combine":
        arguments.append(f"order={given['order']!r}")
    if given.get("mix_every", 1) != 1:
        arguments.append(f"mix_every={given['mix_every']!r}")
    return f"sync=hvdx.Decentralized({', '.join(arguments)})"


def stanza_line(given: Dict[str, object], cluster: Cluster) -> str:
    """``stanza``'s line: a trainer, in code only."""
    return (f"hvd.Stanza(features, head, optimizer, fc_workers="
            f"{given.get('fc_workers', 1)!r}), in code only")


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

