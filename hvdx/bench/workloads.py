"""Training workloads of the benchmark: real models on real data, never sleeps.

- ``digits_cnn``: the small conv + FC network of the examples (about 0.1 M parameters):
  compute-bound, where hvdx must not be slower than Horovod.
- ``digits_vgg``: VGG-like, with a large fully-connected head that holds 96% of the
  parameters, as VGG-16's FC layers hold 124 M of its 138 M: communication-bound on a
  slow uplink, where hvdx must be faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Workload", "WORKLOADS", "parameter_split"]


class DigitsCNN(nn.Module):
    def stanza_parts(self):
        """``(features, head)`` for Stanza: the conv layers (to the flattened pool) and the
        FC layers, as modules that share this model's parameters."""
        return (nn.Sequential(self.conv1, nn.ReLU(), self.conv2, nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten()),
                nn.Sequential(self.fc1, nn.ReLU(), self.fc2))

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DigitsVGG(nn.Module):
    """Two conv blocks, then a wide FC head (the part that dominates the bytes)."""

    def __init__(self, width: int = 1024):
        super().__init__()
        # Batch norm in the conv body only: it makes SGD on this deep ReLU stack train in
        # tens of steps instead of hundreds; the FC head stays plain, as in VGG.
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.classifier = nn.Sequential(
            nn.Linear(64 * 4 * 4, width), nn.ReLU(),
            nn.Linear(width, width // 4), nn.ReLU(),
            nn.Linear(width // 4, 10))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))

    def stanza_parts(self):
        """``(features, head)`` for Stanza: the conv body (flattened) and the FC head,
        sharing this model's parameters."""
        return nn.Sequential(self.features, nn.Flatten()), self.classifier


@dataclass(frozen=True)
class Workload:
    """A model, its optimizer settings and the accuracy that counts as trained."""

    name: str
    make_model: Callable[[], nn.Module]
    lr: float            # for one rank; scaled by the number of ranks
    batch_size: int      # per rank
    target_accuracy: float
    default_steps: int
    description: str
    #: Steps of a quick run (a plain ``hvdx bench``): enough for every strategy to reach
    #: the target and for the mean step to cover whole schedule periods; ``None``: as
    #: many as ``default_steps``.
    quick_steps: Optional[int] = None

    def steps(self, full: bool) -> int:
        """The steps of a run: ``default_steps`` in a full run, else ``quick_steps``."""
        return self.default_steps if full or self.quick_steps is None else self.quick_steps


WORKLOADS: Dict[str, Workload] = {
    "digits_cnn": Workload("digits_cnn", DigitsCNN, lr=0.025, batch_size=32,
                           target_accuracy=0.9, default_steps=120,
                           description="small CNN, 0.04 M parameters (compute-bound)"),
    "digits_vgg": Workload("digits_vgg", DigitsVGG, lr=0.01, batch_size=32,
                           # The slowest to 0.95 was DS-Sync, at step 46 of 100
                           # (`hvdx bench`, 2026-12-07, at 08fdc0d).
                           target_accuracy=0.95, default_steps=100, quick_steps=60,
                           description="VGG-like, 1.4 M parameters, 96% in the FC head "
                                       "(communication-bound)"),
}


def parameter_split(model: nn.Module):
    """``(conv_parameters, fc_parameters)`` counts: where the compute and the bytes are."""
    conv = sum(p.numel() for m in model.modules() if isinstance(m, nn.Conv2d)
               for p in m.parameters(recurse=False))
    fc = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear)
             for p in m.parameters(recurse=False))
    return conv, fc
