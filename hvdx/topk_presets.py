"""Named TopK settings: ``Compression.topk(preset="fast")`` and ``preset="safe"``.

Both are the tuned TopKs of the benchmark (``hvdx bench``'s ``topk_dgc`` and
``topk_masked``, which :mod:`hvdx.bench.strategies` builds from this table, so the two
cannot drift). Which one:

1. ``"fast"``: the fastest to a target accuracy where the uplink is slow: 1% of the
   gradient entries up and 1% down, DGC's momentum correction without factor masking.
   Late in a long run its accuracy can swing;
2. ``"safe"``: for a run that must end well: the same uplink, a downlink twice as dense
   (2%) and DGC's factor masking; stable late in a run, a few steps slower to the
   target;
3. either way, launch with ``HOROVOD_CYCLE_TIME=50`` (:data:`HOROVOD_CYCLE_ENV`): both
   presets average the small tensors in the TopK step itself
   (``small_tensors="in_topk_step"``), so Horovod's background loop carries nothing
   during a step, and its default 1 ms cycle only spins on CPU that training needs.

Arguments given with a preset override its values:
``topk(preset="safe", downlink_ratio=0.05)``. The figures behind the choices are in the
comments below (digits_vgg, 4 ranks on an emulated 2 x 2 cluster with a 100 Mbit uplink).
"""

from __future__ import annotations

from typing import Dict

__all__ = ["HOROVOD_CYCLE_ENV", "PRESETS", "RATIO", "SELECTOR", "SMALL_TENSORS",
           "TOPK_METHOD", "WITHOUT_MOMENTUM_CORRECTION", "preset_options"]

#: The uplink ratio of both presets: the issue's 1%.
RATIO = 0.01
#: DGC's sampled threshold: the exact top k whenever the sampled threshold lets k
#: entries through (recall 1.000 in ``hvdx bench --selection``), at a fraction of the
#: cost of a full partition.
TOPK_METHOD = "sampled_threshold"
#: The old name of :data:`TOPK_METHOD` (``topk``'s ``selector`` is now ``topk_method``).
SELECTOR = TOPK_METHOD
#: Both presets average the tensors below ``min_size`` in the TopK step itself.
SMALL_TENSORS = "in_topk_step"

#: Preset name -> the arguments of ``topk``.
#:
#: fast: steps to 0.95, evaluated every 5 (Horovod 35): DGC's momentum correction with
#: factor masking 45, with global selection 45, without masking and with global
#: selection 35. Masking zeroes the momentum of every entry sent, so the entries that
#: matter most train without momentum; global selection gives the budget to the layers
#: whose gradients are large. DGC's sparsity warm-up (4 or 10 steps) changed nothing
#: and costs bytes, so it is left out.
#:
#: safe: without masking, "fast" swings late in a run (100 steps: between 0.64 and 0.97
#: after step 60); with DGC's factor masking and a downlink twice as dense as the uplink
#: it stays at 0.97-0.99 and ends at 0.991, reaching 0.95 at step 40 (Horovod: 35).
PRESETS: Dict[str, Dict] = {
    "fast": {"ratio": RATIO, "downlink_ratio": RATIO, "topk_method": TOPK_METHOD,
             "selection": "global", "momentum_correction": True,
             "momentum_masking": False, "small_tensors": SMALL_TENSORS},
    "safe": {"ratio": RATIO, "downlink_ratio": 2 * RATIO, "topk_method": TOPK_METHOD,
             "selection": "global", "momentum_correction": True,
             "momentum_masking": True, "small_tensors": SMALL_TENSORS},
}

#: The Horovod setting both presets want in the job's environment. With the small
#: tensors averaged in the TopK step, Horovod still meets the other ranks in a small collective
#: every HOROVOD_CYCLE_TIME (1 ms by default), and MPICH spins while it waits for ranks
#: whose cores are busy; a 50 ms cycle gives that CPU back to training. "fast"
#: (4 ranks on 2 cores, alternating runs): median step 111-127 ms against 151-175 ms
#: with Horovod's default cycle and Horovod averaging the small tensors; the cycle alone
#: (Horovod still averaging them, so waiting a cycle for them each step): 121-129 ms.
HOROVOD_CYCLE_ENV: Dict[str, str] = {"HOROVOD_CYCLE_TIME": "50"}

#: What TensorFlow's ``topk(preset=...)`` changes: DGC's momentum correction is
#: implemented for PyTorch's SGD only, so there the presets run without it (and without
#: its factor masking); every other setting is the preset's.
WITHOUT_MOMENTUM_CORRECTION: Dict = {"momentum_correction": False,
                                     "momentum_masking": True}


def preset_options(preset: str) -> Dict:
    """A copy of ``preset``'s arguments of ``topk``.

    Raises:
        ValueError: ``preset`` is not a name of :data:`PRESETS`, naming it and them.
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"preset={preset!r} must be one of "
                         f"{', '.join(repr(name) for name in PRESETS)}")
    return dict(PRESETS[preset])
