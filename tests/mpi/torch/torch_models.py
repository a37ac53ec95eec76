"""Small models and data for the torch MPI tests."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """Conv and FC layers, as in the digits example (8x8 inputs)."""

    def __init__(self, hidden=32):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def batches(rank, steps, batch=16, seed=0):
    """Different data on every rank, the same on every run."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]
