"""How fast TopK selection is, as ratios measured in one run (``hvdx bench --selection``).

The bar: selecting 1% of a 10M-element gradient takes at most 3x one elementwise
pass (``abs``) over it, and is at least 3x faster than ``torch.topk``. Selection runs on
the CPU copy of the gradient (numpy), which is where hvdx's TopK path selects.
"""

from __future__ import annotations

import time
from typing import Dict

from hvdx.strategies.topk.core_selection import benchmark_selection

__all__ = ["measure", "render"]


def measure(n: int = 10_000_000, ratio: float = 0.01, repeat: int = 5) -> Dict[str, float]:
    """numpy abs, exact and threshold selection, and torch.topk on the same data."""
    import numpy as np
    import torch

    result = benchmark_selection(n=n, ratio=ratio, repeat=repeat)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        torch.topk(x.abs(), result["k"], sorted=False)
        times.append(time.perf_counter() - start)
    result["torch_topk_s"] = min(times)
    return result


def render(r: Dict[str, float]) -> str:
    ms = lambda key: f"{1e3 * r[key]:.1f} ms"  # noqa: E731
    return "\n".join([
        f"TopK selection of k={r['k']:,} from n={r['n']:,} float32 (best of runs, one process)",
        f"  numpy abs (one pass)      {ms('abs_s')}",
        f"  exact selection           {ms('exact_s')}   {r['exact_s'] / r['abs_s']:.1f}x abs",
        f"  threshold selection       {ms('threshold_s')}   "
        f"{r['threshold_s'] / r['abs_s']:.1f}x abs, recall {r['recall']:.3f}",
        f"  torch.topk                {ms('torch_topk_s')}   threshold is "
        f"{r['torch_topk_s'] / r['threshold_s']:.1f}x faster, exact "
        f"{r['torch_topk_s'] / r['exact_s']:.1f}x faster",
    ])
