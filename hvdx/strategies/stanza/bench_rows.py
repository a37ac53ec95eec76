"""Stanza's rows of ``hvdx bench``'s table (its descriptor's ``bench``): one FC worker
(row ``stanza``), two, a probed number, and micro-batches (run when named), and the
bytes its steps put on the network (:func:`stanza_bytes`). torch is imported inside the
builders, on the ranks that train.
"""

from __future__ import annotations

from typing import Dict

from hvdx.bench.strategy_row import BenchRow, allreduce_bytes_per_rank

__all__ = ["STANZA_NEEDS_CODE", "stanza_bytes", "stanza_strategy"]


def _stanza_with(fc_workers, micro_batches=1):
    """The builder of a Stanza trainer over the workload's ``stanza_parts()``."""
    def build(optimizer, model, example):
        import hvdx.torch as hvd

        features, head = model.stanza_parts()
        return hvd.Stanza(features, head, optimizer, fc_workers=fc_workers,
                          example=example if fc_workers == "auto" else None,
                          micro_batches=micro_batches)
    return build


def stanza_bytes(trainer, model, size, steps):
    """hvdx's own count of what Stanza's steps put on the network: the point-to-point
    messages as sent (activations, their gradients, losses and batch sizes), and each
    role allreduce at its standard cost, ``2 (m - 1) / m`` times the buffer over the
    role's ``m`` ranks (:func:`allreduce_bytes_per_rank`; the trainer counts the buffer
    it hands to MPI); not the one-off ``setup`` transfers (the initial broadcast,
    ``full_model`` for the evaluations)."""
    stats, roles = trainer.stats, trainer.roles
    ranks = {"conv_allreduce": len(roles.conv_ranks), "fc_allreduce": len(roles.fc_ranks)}

    def total(counts):
        return sum(allreduce_bytes_per_rank(v, ranks[k]) if k in ranks else v
                   for k, v in counts.items() if k != "setup")
    return total(stats.sent) / steps, total(stats.received) / steps


def _stanza_options(trainer) -> Dict:
    """The cost model's options for the layout the run used (``"auto"`` decides at
    start-up)."""
    return {"fc_workers": trainer.roles.fc_workers}


def _stanza_final_stats(trainer, steps) -> Dict:
    figures = {"fc_workers": trainer.roles.fc_workers, "conv_ranks": list(trainer.roles.conv_ranks),
               "fc_ranks": list(trainer.roles.fc_ranks)}
    if trainer.probe is not None:
        figures["probe"] = {"conv_s": trainer.probe["conv_s"],
                            "head_s": {str(k): v for k, v in trainer.probe["head_s"].items()}}
    return figures


#: Why ``hvdx bench --script`` cannot run Stanza.
STANZA_NEEDS_CODE = ("Stanza needs code (hvd.Stanza(features, head, ...) drives the "
                     "training step): no variable switches a script to it")


def stanza_strategy(name: str, fc_workers=1, micro_batches: int = 1) -> BenchRow:
    """A Stanza row: ``fc_workers`` FC workers (``"auto"``: a probe decides), each batch
    in ``micro_batches``."""
    if fc_workers == "auto":
        workers = "FC workers chosen by a probe (fc_workers='auto')"
    else:
        workers = f"{fc_workers} FC worker{'s' if fc_workers != 1 else ''}"
    if micro_batches != 1:
        workers += (f", each batch in {micro_batches} micro-batches (the head on one while "
                    "the features compute the next)")
    elif fc_workers == 1:
        workers += " (the last rank)"
    return BenchRow(name, f"Stanza layer separation, {workers}",
                    _stanza_with(fc_workers, micro_batches), stanza_bytes,
                    cost_model="stanza",
                    cost_options={"fc_workers": 1 if fc_workers == "auto" else fc_workers},
                    cost_options_of=_stanza_options,
                    final_stats=_stanza_final_stats, roles=True,
                    needs_code=STANZA_NEEDS_CODE)
