"""Under ``hvdx plan``'s table, what a script writes to run each strategy
(:func:`run_line`): the argument of ``DistributedOptimizer`` (``HVDX_COMPRESSION`` /
``HVDX_SYNC`` take the same call), and the TopK preset that sends the same bytes. Each
strategy's line is its descriptor's ``plan_line``, a function in its own folder
(``hvdx/strategies/<name>/plan_line.py``).
"""

from __future__ import annotations

from typing import Dict, Optional

from hvdx.core.cost_model import Cluster

__all__ = ["MODEL_ONLY", "run_line"]

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
