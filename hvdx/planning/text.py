"""``hvdx plan``'s text (:func:`render`): the cluster, the workload, then the table,
each strategy's ``to run`` line and the verdict, or the sweep and its winners.
"""

from __future__ import annotations

from typing import Dict, List

from hvdx.core.cost.verdict import PLAN_TOLERANCE
from hvdx.core.cost_model import format_rate
from hvdx.core.units import format_time

__all__ = ["render"]


def render(figures: Dict[str, object]) -> str:
    """The text of :func:`~hvdx.planning.figures.report`'s figures: the cluster, the
    workload, then the table and the verdict, or the sweep and its winners."""
    lines = [_describe(figures["cluster"], figures["workload"])]
    if "sweep" in figures:
        lines += _sweep_lines(figures["sweep"])
        return "\n".join(lines)
    rows = figures["strategies"]
    lines.append(_table(rows))
    lines += _model_only_note(rows)
    stanza = next((r for r in rows if r["strategy"] == "stanza"), None)
    if stanza is not None:
        lines.append(f"(speedups compare time per batch: stanza trains on "
                     f"{stanza['data_ranks']} of {figures['cluster']['ranks']} ranks)")
    lines += _run_lines(rows)
    lines.append(_verdict(figures["verdict"]))
    return "\n".join(lines)


def _describe(c: Dict[str, object], w: Dict[str, object]) -> str:
    return (f"cluster: {c['racks']} racks x {c['hosts_per_rack']} hosts x "
            f"{c['ranks_per_host']} rank(s) = {c['ranks']} ranks; NIC "
            f"{format_rate(c['nic_bps'])}, uplink {format_rate(c['uplink_bps'])} "
            f"({c['oversubscription']:g}:1), latency {format_time(c['latency_s'])}, "
            f"{c['placement']} placement\n"
            + (f"calibrated: rounds measured on {c['calibration']}\n"
               if c.get("calibration") is not None else "") +
            f"workload: {w['params'] / 1e6:g}M params ({w['fc_params'] / 1e6:g}M FC), "
            f"{w['bytes_per_element']} B each, compute {w['compute_ms']:g} ms/step, "
            f"batch {w['batch_size']}, activations {w['activation_size']}/sample")


def _label(row: Dict[str, object]) -> str:
    return f"{row['label']} (model only)" if row["model_only"] else row["label"]


def _model_only_note(rows: List[Dict[str, object]]) -> List[str]:
    if not any(r["model_only"] for r in rows):
        return []
    return ["(model only: priced by the cost model for comparison; not an hvdx strategy)"]


def _columns(table: List[List[str]]) -> List[str]:
    """Rows of cells, the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[j]) for row in table) for j in range(len(table[0]))]
    return ["  ".join(cell.ljust(width) if j == 0 else cell.rjust(width)
                      for j, (cell, width) in enumerate(zip(row, widths))) for row in table]


def _table(rows: List[Dict[str, object]]) -> str:
    table = [["strategy", "step ms", "comm ms", "MB/rank/step", "bottleneck", "vs horovod"]]
    table += [[_label(r), f"{r['step_ms']:.1f}", f"{r['comm_ms']:.1f}",
               f"{r['mb_per_rank_per_step']:.2f}", r["bottleneck"], f"{r['vs_horovod']:.2f}x"]
              for r in rows]
    return "\n".join(_columns(table))


def _run_lines(rows: List[Dict[str, object]]) -> List[str]:
    """Under the table: each row's label and what a script writes to run it."""
    runnable = [r for r in rows if r["run"] is not None]
    width = max(len(r["label"]) for r in runnable)
    return (["to run (DistributedOptimizer's argument; HVDX_COMPRESSION / HVDX_SYNC take "
             "the same call):"]
            + [f"  {r['label'].ljust(width)}  {r['run']}" for r in runnable])


def _faster_model_only(winner: Dict[str, object]) -> str:
    faster = winner["faster_model_only"]
    return f"; faster in the model only: {', '.join(faster)}" if faster else ""


def _verdict(v: Dict[str, object]) -> str:
    if v["tied"] and v["compute_bound"]:
        names = [v["label"]] + v["tied"]
        return (f"verdict: too close to call between {', '.join(names)} (within "
                f"{PLAN_TOLERANCE:.0%} of the fastest per batch): the step is mostly "
                f"compute (wire {v['wire_share']:.0%} of {v['label']}'s step), so the "
                "ranking rests on each strategy's compute and CPU work, where the plan's "
                "error (a quarter on shared cores) exceeds their differences; time them "
                "on your own job: `hvdx bench --script YOUR_SCRIPT`" + _faster_model_only(v))
    tie = (f"; within the plan's {PLAN_TOLERANCE:.0%} error of it: {', '.join(v['tied'])}"
           if v["tied"] else "")
    if v["strategy"] == "horovod":
        return ("verdict: horovod wins; no hvdx strategy is predicted to pay here"
                + tie + _faster_model_only(v))
    return (f"verdict: {v['label']} wins, {v['vs_horovod']:.2f}x horovod per batch "
            f"({v['step_ms']:.1f} ms/step, bottleneck {v['bottleneck']})"
            + tie + _faster_model_only(v))


def _sweep_lines(points: List[Dict[str, object]]) -> List[str]:
    """One column per sweep point, one row per strategy, then the winner at each point."""
    table = [["uplink"] + [format_rate(p["uplink_bps"]) for p in points],
             ["oversubscription"] + [f"{p['oversubscription']:g}:1" for p in points]]
    for i, first in enumerate(points[0]["strategies"]):
        table.append([f"{_label(first)}, step ms"]
                     + [f"{p['strategies'][i]['step_ms']:.1f}" for p in points])
    lines = _columns(table) + _model_only_note(points[0]["strategies"])
    lines += _run_lines(points[0]["strategies"])
    for p in points:
        w = p["winner"]
        lines.append(f"winner at uplink {format_rate(p['uplink_bps'])} "
                     f"({p['oversubscription']:g}:1): {w['label']}, "
                     f"{w['vs_horovod']:.2f}x horovod per batch" + _faster_model_only(w))
    return lines


