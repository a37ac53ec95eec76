"""``hvdx plan``'s figures: every strategy priced on the flags' cluster and workload
(:func:`report`), fastest first with the verdict, or at each point of a sweep of uplink
rates or oversubscription ratios; what ``--json`` prints (:data:`hvdx.plan.JSON_KEYS`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from hvdx.core.cost.verdict import compute_bound, tied, wire_share
from hvdx.core.cost_model import (
    DEFAULT_STRATEGIES,
    Cluster,
    Prediction,
    Workload,
    compare,
    parse_rate,
    predict,
    speedup,
)
from hvdx.planning.flags import (
    build_cluster,
    build_workload,
    in_flag_terms,
    local_cores,
    local_steps,
    local_waits,
    strategy_options,
)
from hvdx.planning.run_lines import MODEL_ONLY, run_line

__all__ = ["report"]

_DEFAULT_SWEEP = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def report(args: argparse.Namespace) -> Dict[str, object]:
    """The figures for parsed ``hvdx plan`` arguments: what ``--json`` prints
    (:data:`hvdx.plan.JSON_KEYS`) and :func:`hvdx.planning.text.render` writes as text.

    Raises:
        ValueError: naming the flag, for a bad value.
    """
    try:
        return _report(args)
    except ValueError as error:
        raise ValueError(in_flag_terms(str(error), args)) from None



def _report(args: argparse.Namespace) -> Dict[str, object]:
    cluster, workload, options = build_cluster(args), build_workload(args), strategy_options(args)
    if args.sweep is not None and cluster.calibration is not None:
        raise ValueError(f"--sweep={args.sweep!r} with --calibration: the calibration "
                         "was measured at one uplink rate; sweep without it")
    figures: Dict[str, object] = {"cluster": _cluster_figures(cluster),
                                  "workload": _workload_figures(workload)}
    # A local step does not depend on the links: it holds at every point of a sweep.
    local = local_steps(getattr(args, "local_steps", None))
    waits = local_waits(getattr(args, "local_waits", None), local)
    cores = local_cores(getattr(args, "local_cores", None)) if waits else None
    if args.sweep is not None:
        figures["sweep"] = [_sweep_point(point, workload, options, local, waits, cores)
                            for point in _sweep_points(args.sweep, cluster)]
    else:
        baseline = predict("horovod", cluster, workload, local.get("horovod"),
                           waits.get("horovod"), cores)
        # Fastest first, as compare() ranks them (a stable sort: ties keep entry order).
        predicted = sorted(_predictions(cluster, workload, options, local, waits, cores),
                           key=lambda pair: pair[0].seconds_per_batch)
        rows = [_row(p, baseline, run) for p, run in predicted]
        figures["strategies"] = rows
        figures["verdict"] = _winner(rows)
    return figures


def _cluster_figures(c: Cluster) -> Dict[str, object]:
    return {"racks": c.racks, "hosts_per_rack": c.hosts_per_rack,
            "ranks_per_host": c.ranks_per_host, "ranks": c.ranks, "nic_bps": c.nic_bps,
            "uplink_bps": c.uplink_bps, "oversubscription": c.oversubscription,
            "latency_s": c.latency_s, "intra_host_bps": c.intra_host_bps,
            "placement": c.placement,
            "calibration": None if c.calibration is None else c.calibration.source}


def _workload_figures(w: Workload) -> Dict[str, object]:
    return {"params": w.params, "fc_params": w.fc_params,
            "bytes_per_element": w.bytes_per_element, "compute_ms": w.compute_s * 1e3,
            "batch_size": w.batch_size, "activation_size": w.activation_size}


def _row(p: Prediction, baseline: Prediction, run: Optional[str]) -> Dict[str, object]:
    return {"strategy": p.strategy, "label": p.label, "model_only": p.strategy in MODEL_ONLY,
            "step_ms": p.step_s * 1e3, "compute_ms": p.compute_s * 1e3,
            "comm_ms": p.comm_s * 1e3,
            "hidden_ms": p.hidden_s * 1e3,
            "mb_per_rank_per_step": p.bytes_per_rank / 1e6, "bottleneck": p.bottleneck,
            "vs_horovod": speedup(p, baseline), "data_ranks": p.data_ranks, "run": run}


def _predictions(cluster: Cluster, workload: Workload, options: Dict[str, object],
                 local: Dict[str, float], waits: Dict[str, float],
                 cores: Optional[int]) -> List[Tuple[Prediction, Optional[str]]]:
    """``(prediction, to run)`` of every entry of ``DEFAULT_STRATEGIES``, in its order
    (compare() one entry at a time keeps each prediction with its entry's options)."""
    return [(compare(cluster, workload, [entry], local, waits, cores, **options)[0],
             run_line(entry, options, cluster)) for entry in DEFAULT_STRATEGIES]


def _winner(rows: List[Dict[str, object]]) -> Dict[str, object]:
    """The fastest strategy hvdx can run (Horovod's own included), and the model-only
    strategies predicted faster still: a verdict must name something one can use."""
    ranked = sorted(rows, key=lambda r: -r["vs_horovod"])  # stable: ties keep row order
    best = next(r for r in ranked if not r["model_only"])
    # Time per batch is proportional to 1 / vs_horovod; the best is first.
    close = tied({r["label"]: 1.0 / r["vs_horovod"] for r in ranked if not r["model_only"]})
    share = wire_share(best["step_ms"], best["compute_ms"])
    return {"label": best["label"], "strategy": best["strategy"],
            "vs_horovod": best["vs_horovod"], "step_ms": best["step_ms"],
            "bottleneck": best["bottleneck"],
            "faster_model_only": [r["label"] for r in ranked
                                  if r["model_only"] and r["vs_horovod"] > best["vs_horovod"]],
            "tied": close[1:], "wire_share": share,
            "compute_bound": compute_bound(best["step_ms"], best["compute_ms"])}


def _sweep_point(cluster: Cluster, workload: Workload, options: Dict[str, object],
                 local: Dict[str, float], waits: Dict[str, float],
                 cores: Optional[int]) -> Dict[str, object]:
    # In DEFAULT_STRATEGIES order: the sweep's table has a row per entry.
    predictions = _predictions(cluster, workload, options, local, waits, cores)
    baseline = next(p for p, _ in predictions if p.strategy == "horovod")
    rows = [_row(p, baseline, run) for p, run in predictions]
    return {"uplink_bps": cluster.uplink_bps, "oversubscription": cluster.oversubscription,
            "strategies": rows, "winner": _winner(rows)}


def _sweep_uplink(value: str, base: Cluster) -> float:
    """A plain number is an oversubscription ratio, anything else an uplink rate."""
    try:
        ratio = float(value)
    except ValueError:
        return parse_rate(value, "--sweep")
    if not 0 < ratio < math.inf:
        raise ValueError(f"--sweep={value!r} must be a positive ratio (e.g. 4) or a rate")
    return base.hosts_per_rack * base.nic_bps / ratio


def _sweep_points(text: str, base: Cluster) -> List[Cluster]:
    """``base`` with each uplink of the comma-separated ``text`` (``"default"``: 1:1 to 64:1)."""
    values = [f"{v:g}" for v in _DEFAULT_SWEEP] if text == "default" else \
        [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError(f"--sweep={text!r} names no values")
    return [dataclasses.replace(base, uplink_bps=_sweep_uplink(v, base)) for v in values]


