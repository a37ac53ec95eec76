"""Named TopK settings: ``Compression.topk(preset="fast")`` and ``preset="safe"``.

Both are the tuned TopKs of the benchmark (``hvdx bench``'s rows ``fast`` and ``safe``,
once ``topk_dgc`` and ``topk_masked``, which :mod:`hvdx.strategies.topk.bench_rows`
builds from this table, so the two cannot drift). Which one:

1. ``"fast"``: the fewest bytes: 1% of the gradient entries up and 1% down, DGC's
   momentum correction with its factor masking;
2. ``"safe"``: the same with a downlink twice as dense (2%), for a run that must end
   as close to Horovod as it can;
3. either way, launch with ``HOROVOD_CYCLE_TIME=50`` (:data:`HOROVOD_CYCLE_ENV`): both
   presets average the small tensors in the TopK step itself
   (``small_tensors="in_topk_step"``), so Horovod's background loop carries nothing
   during a step, and its default 1 ms cycle only spins on CPU that training needs.

Arguments given with a preset override its values:
``topk(preset="safe", downlink_ratio=0.05)``. The figures behind the choices are in the
comments below (digits_vgg, 4 ranks on an emulated 2 x 2 cluster with a 100 Mbit uplink).

DGC's momentum correction takes over the momentum of ``torch.optim.SGD`` (without
Nesterov or dampening), so a preset keeps it only where it applies, and with an
adaptive optimizer (Adam's family) a preset sends more (:func:`for_optimizer`):

1. ``momentum_correction`` given by the caller (either value) is the caller's: the
   preset does not touch it, and ``True`` with another optimizer stays refused;
   ``False`` drops the preset's masking setting too (:func:`preset_arguments`);
2. otherwise, with an optimizer other than SGD, SGD with Nesterov or dampening, or SGD
   without momentum in every parameter group, the preset runs without momentum
   correction and its masking (:data:`WITHOUT_MOMENTUM_CORRECTION`), every other
   setting unchanged; TensorFlow always does (its optimizers are not torch's SGD);
3. with an optimizer whose every parameter group has ``betas`` (Adam, AdamW, NAdam,
   RAdam, Adamax), the ratios the preset chose (not the caller's) become
   :data:`ADAPTIVE_RATIO` both ways;
4. the choice depends on the optimizer's class and ``param_groups`` only, the same on
   every rank, so the settings the ranks compare still agree.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, FrozenSet, Iterable, Mapping, Optional, Tuple

__all__ = ["ADAPTIVE_RATIO", "HOROVOD_CYCLE_ENV", "PRESETS", "RATIO", "SELECTOR", "SMALL_TENSORS",
           "TOPK_METHOD", "WITHOUT_MOMENTUM_CORRECTION", "for_optimizer",
           "momentum_correction_refusal", "preset_arguments", "preset_options",
           "tensorflow_arguments"]

#: The uplink ratio of both presets: 1% of the gradient.
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
#: Both mask: DGC's factor masking zeroes the momentum of every entry sent. Without it
#: "fast" reached 0.95 on digits_vgg sooner (step 35 against 45, Horovod 35) but swung
#: late in a run (100 steps: between 0.64 and 0.97 after step 60) and ended the main
#: command's run 7-9 points below Horovod (0.894-0.911 against 0.980-0.982); the
#: quick start's preset must not trade accuracy without saying so. Global selection
#: gives the budget to the layers whose gradients are large. DGC's sparsity warm-up
#: (4 or 10 steps) changed nothing and costs bytes, so it is left out.
#:
#: safe: with a downlink twice as dense as the uplink it stays at 0.97-0.99 and ends at
#: 0.991 on digits_vgg, reaching 0.95 at step 40 (Horovod: 35).
PRESETS: Dict[str, Dict] = {
    "fast": {"ratio": RATIO, "downlink_ratio": RATIO, "topk_method": TOPK_METHOD,
             "selection": "global", "momentum_correction": True,
             "momentum_masking": True, "small_tensors": SMALL_TENSORS},
    "safe": {"ratio": RATIO, "downlink_ratio": 2 * RATIO, "topk_method": TOPK_METHOD,
             "selection": "global", "momentum_correction": True,
             "momentum_masking": True, "small_tensors": SMALL_TENSORS},
}

#: Both ratios of a preset under an adaptive optimizer (Adam's family). Adam divides
#: each entry's step by its own running gradient scale, so the residual that error
#: feedback sends at once after holding it for many steps moves its entry about as far
#: as one ordinary step, not as far as the steps it held: the entries sent rarely train
#: slowly. On the ``lm`` transformer (AdamW, 2 ranks, the bench's global batch,
#: validation bits per byte at steps 40 / 60 / 80) Horovod gave 4.40 / 4.39 / 4.33;
#: 1% both ways 4.80 / 4.75 / 4.70; 5% 4.74 / 4.72 / 4.42; 10% 4.48 / 4.40 / 4.36; 20%
#: 4.40 / 4.36 / 4.30.
ADAPTIVE_RATIO = 0.2

#: The Horovod setting both presets want in the job's environment. With the small
#: tensors averaged in the TopK step, Horovod still meets the other ranks in a small collective
#: every HOROVOD_CYCLE_TIME (1 ms by default), and MPICH spins while it waits for ranks
#: whose cores are busy; a 50 ms cycle gives that CPU back to training. "fast"
#: (4 ranks on 2 cores, alternating runs): median step 111-127 ms against 151-175 ms
#: with Horovod's default cycle and Horovod averaging the small tensors; the cycle alone
#: (Horovod still averaging them, so waiting a cycle for them each step): 121-129 ms.
HOROVOD_CYCLE_ENV: Dict[str, str] = {"HOROVOD_CYCLE_TIME": "50"}

#: What a preset changes where DGC's momentum correction does not apply (TensorFlow, a
#: torch optimizer other than plain SGD with momentum; :func:`for_optimizer`): it runs
#: without it and without its factor masking (``momentum_masking=True`` is the default,
#: which masks nothing without momentum correction); every other setting is the preset's.
WITHOUT_MOMENTUM_CORRECTION: Dict = {"momentum_correction": False,
                                     "momentum_masking": True}


def tensorflow_arguments(kwargs: Dict) -> Dict:
    """``topk``'s keyword arguments as TensorFlow's ``hvd.Compression.topk`` passes them
    on (TopK's ``tensorflow_arguments`` in the catalogue): with ``preset=``, DGC's
    momentum correction off unless given (:data:`WITHOUT_MOMENTUM_CORRECTION`), since
    it is implemented for PyTorch's SGD only; without, as given."""
    if kwargs.get("preset") is None:
        return kwargs
    return dict(WITHOUT_MOMENTUM_CORRECTION, **kwargs)


def preset_options(preset: str) -> Dict:
    """A copy of ``preset``'s arguments of ``topk``.

    Raises:
        ValueError: ``preset`` is not a name of :data:`PRESETS`, naming it and them.
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"preset={preset!r} must be one of "
                         f"{', '.join(repr(name) for name in PRESETS)}")
    return dict(PRESETS[preset])


def preset_arguments(preset: str, given: Mapping) -> Tuple[Dict, FrozenSet[str]]:
    """``topk``'s arguments for ``preset`` with the caller's ``given`` ones, and the
    names whose value is the preset's.

    1. the preset's values;
    2. ``given`` turns ``momentum_correction`` off: the preset's momentum settings go
       with it (:data:`WITHOUT_MOMENTUM_CORRECTION`), because masking is part of
       momentum correction ("fast"'s ``momentum_masking=False`` would otherwise be
       refused as if the caller had set it);
    3. ``given`` overrides, even with a value equal to the default.

    Raises:
        ValueError: ``preset`` is not a name of :data:`PRESETS`.
    """
    options = preset_options(preset)
    if "momentum_correction" in given and given["momentum_correction"] is False:
        options.update(WITHOUT_MOMENTUM_CORRECTION)
    return dict(options, **given), frozenset(options) - frozenset(given)


def momentum_correction_refusal(optimizer: str, param_groups: Iterable[Mapping]
                                ) -> Optional[str]:
    """Why ``momentum_correction=True`` cannot run with a torch optimizer of class name
    ``optimizer`` and these ``param_groups`` (the error message), or ``None``.

    It takes ``torch.optim.SGD``'s momentum and weight decay over: SGD without Nesterov
    or dampening only (anything else would be applied twice or differently). Read from
    the parameter groups' keys (SGD's), not the class, so a subclass of SGD is accepted.
    """
    mismatch = _mismatch(optimizer, param_groups)
    return None if mismatch is None else mismatch[1]


def for_optimizer(spec, optimizer: str, param_groups: Iterable[Mapping]):
    """``spec`` (a ``TopKCompression``) as it runs with a torch optimizer of class name
    ``optimizer`` and these ``param_groups``, and what changed and why, as a clause of
    rank 0's message (``None``: unchanged).

    1. only what a preset chose changes (the caller's own values are theirs: an
       explicit ``momentum_correction=True`` stays refused by the optimizer);
    2. momentum correction from the preset, and :func:`momentum_correction_refusal`
       refuses the optimizer, or no parameter group has a momentum above 0 (nothing to
       correct): the spec without momentum correction
       (:data:`WITHOUT_MOMENTUM_CORRECTION`);
    3. an adaptive optimizer (every parameter group has Adam's ``betas``): the ratios
       the preset chose become :data:`ADAPTIVE_RATIO`;
    4. pure and rank-independent: the optimizer's class and groups are the same on
       every rank, so every rank gets the same spec.
    """
    groups = list(param_groups)
    changes, reasons = {}, []
    if spec.momentum_correction and "momentum_correction" in spec.from_preset:
        mismatch = _mismatch(optimizer, groups)
        if mismatch is not None:
            why = mismatch[0]
        elif not any(group["momentum"] for group in groups):
            why = f"{optimizer} has momentum 0 in every parameter group: nothing to correct"
        else:
            why = None
        if why is not None:
            changes.update(WITHOUT_MOMENTUM_CORRECTION)
            reasons.append(f"runs without DGC's momentum correction and its masking ({why})")
    ratios = {name: ADAPTIVE_RATIO for name in ("ratio", "downlink_ratio")
              if name in spec.from_preset and getattr(spec, name) is not None}
    if ratios and groups and all("betas" in group for group in groups):
        # The ratios live in the spec's TopKConfig.
        changes["config"] = dataclasses.replace(spec.config, **ratios)
        sent = ", ".join(f"{name}={value}" for name, value in ratios.items())
        reasons.append(f"sends {sent} ({optimizer} is adaptive: it scales each entry's "
                       "step by its own gradient history, so a residual error feedback "
                       "held for many steps moves its entry about one step when sent)")
    if not changes:
        return spec, None
    changed = dataclasses.replace(spec, **changes)
    # Not a field: the variable it came from, which the settings the ranks compare name.
    object.__setattr__(changed, "environment", spec.environment)
    return changed, " and ".join(reasons)


def _mismatch(optimizer: str, param_groups: Iterable[Mapping]
              ) -> Optional[Tuple[str, str]]:
    """``(why, error)`` where momentum correction cannot take the optimizer's momentum
    over: the first parameter group that is not plain SGD's; ``None`` if every one is."""
    for group in param_groups:
        if "momentum" not in group or "dampening" not in group:
            return (f"{optimizer} is not torch.optim.SGD, whose momentum it takes over",
                    f"momentum_correction=True needs torch.optim.SGD (with momentum), got "
                    f"{optimizer}; use momentum_correction=False")
        if group.get("nesterov") or group["dampening"]:
            settings = f"nesterov={group.get('nesterov')}, dampening={group['dampening']}"
            return (f"{optimizer} with {settings}: it replaces plain SGD momentum only",
                    f"momentum_correction=True supports SGD without Nesterov or "
                    f"dampening, got {settings}")
    return None
