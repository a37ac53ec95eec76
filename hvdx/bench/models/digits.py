"""The two small networks on scikit-learn's 8x8 digits.

- :class:`DigitsCNN`: two convolutions and two FC layers (about 0.04 M parameters):
  compute-bound, where hvdx must not be slower than Horovod;
- :class:`DigitsVGG`: VGG-like, with a large fully-connected head that holds 96% of the
  parameters, as VGG-16's FC layers hold 124 M of its 138 M: communication-bound on a
  slow uplink.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["DigitsCNN", "DigitsVGG"]


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
