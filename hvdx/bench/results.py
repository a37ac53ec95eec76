"""The bench's results: ``results.json``, ``results.csv`` and ``results.png``
(:func:`write`), the comparison table (:func:`render_table`), and per workload the
fastest strategy against the one the plan names (:func:`fastest_lines`).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict
from typing import Dict, List

from hvdx.bench.summary import Summary
from hvdx.core.cost.verdict import PLAN_TOLERANCE, compute_bound, tied

__all__ = ["fastest_lines", "render_table", "write"]


def write(rows: List[Summary], raw: List[Dict], out_dir: str) -> None:
    table = [dict(asdict(r), bytes_agreement=r.bytes_agreement,
                  prediction_error=r.prediction_error) for r in rows]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"summary": table, "runs": raw}, f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    from hvdx.bench.plot import plot

    plot(raw, rows, os.path.join(out_dir, "results.png"))


def fastest_lines(rows: List[Summary]) -> List[str]:
    """Per workload and placement, the strategy that trained a batch fastest (mean step
    over its data ranks, as :attr:`Summary.prediction_error` measures) and the one the
    plan ranks first: the verdict ``hvdx plan`` would have given, checked."""
    def fastest(row: Summary, per_batch: float) -> str:
        # The table shows whole steps; a batch's time is a step shared by the ranks
        # that train on a batch (stanza's FC workers do not), so say how it was made.
        step, kind = (row.mean_step_s, "mean") if row.mean_step_s else \
            (row.median_step_s, "median")
        ranks = f"{row.data_ranks} data rank{'s' if row.data_ranks != 1 else ''}"
        return (f"fastest per batch: {row.strategy}, {per_batch * 1e3:.1f} ms per batch "
                f"(its {step * 1e3:.1f} ms {kind} step over {ranks})")

    lines = []
    for key in dict.fromkeys((r.workload, r.placement) for r in rows):
        priced = [r for r in rows if (r.workload, r.placement) == key and r.data_ranks
                  and r.predicted_step_s and (r.mean_step_s or r.median_step_s)]
        if len(priced) < 2:
            continue
        measured = {r.strategy: (r.mean_step_s or r.median_step_s) / r.data_ranks
                    for r in priced}
        planned = {r.strategy: r.predicted_step_s / r.data_ranks for r in priced}
        best, named = min(measured, key=measured.get), min(planned, key=planned.get)
        where = key[0] + (f" ({key[1]} placement)" if key[1] not in (None, "blocked") else "")
        said = fastest(next(r for r in priced if r.strategy == best), measured[best])
        close = tied(planned)
        first = next(r for r in priced if r.strategy == named)
        if len(close) > 1 and first.predicted_compute_s is not None and \
                compute_bound(first.predicted_step_s, first.predicted_compute_s):
            # What hvdx plan says on these figures: no winner (hvdx.plan's verdict).
            lines.append(f"{where}: {said}; mostly compute, the plan calls it too close "
                         f"to call between {', '.join(close)}"
                         + ("" if best in close else
                            f", and {best} was not among them"))
            continue
        verdict = "the plan names it" if named == best else (
            f"the plan names {named} ({planned[named] * 1e3:.1f} ms per batch), which took "
            f"{measured[named] / measured[best] - 1:.0%} longer"
            + (f"; the plan had {best} within its {PLAN_TOLERANCE:.0%} error of it"
               if best in tied(planned) else ""))
        lines.append(f"{where}: {said}, {planned[best] * 1e3:.1f} ms planned; {verdict}")
    return lines


def _fmt(value, spec, none="-"):
    return none if value is None else format(value, spec)


def render_table(rows: List[Summary]) -> str:
    """The comparison table, one row per workload and strategy (and placement, when a
    run placed ranks other than blocked: ``decentralized@interleaved``)."""
    header = ("workload", "strategy", "step ms", "x floor", "to target s", "final",
              "MB/rank/step", "iface rx MB", "agree", "step x", "target x", "mean ms",
              "plan ms", "plan err")
    placed = any(r.placement not in (None, "blocked") for r in rows)
    table = [header]
    for r in rows:
        name = f"{r.strategy}@{r.placement}" if placed and r.placement else r.strategy
        table.append((
            r.workload, name, _fmt(r.median_step_s * 1e3, ".1f"), _fmt(r.floor_multiple, ".2f"),
            _fmt(r.time_to_target_s, ".1f", "not reached"),
            f"{r.final_quality:.3f} {r.unit}",
            _fmt(r.hvdx_bytes_per_step / 1e6, ".3f"),
            _fmt(r.interface_rx_per_step and r.interface_rx_per_step / 1e6, ".3f"),
            _fmt(r.bytes_agreement, ".3f"), _fmt(r.step_speedup, ".2f"),
            _fmt(r.target_speedup, ".2f"),
            _fmt(r.mean_step_s and r.mean_step_s * 1e3, ".1f"),
            _fmt(r.predicted_step_s and r.predicted_step_s * 1e3, ".1f"),
            _fmt(r.prediction_error, "+.0%")))
    # Columns at least 12 wide, wider for long names (decentralized_static@interleaved).
    widths = [max(12, *(len(row[i]) for row in table)) for i in range(len(header))]
    lines = [rows[0].network if rows else ""]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(row, widths)) for row in table]
    return "\n".join(lines)
