"""ResNet-18's block structure (He et al., CVPR 2016, "Deep Residual Learning for Image
Recognition"), narrower, for 28x28 grey images.

1. a 3x3 stem convolution with batch norm, stride ``stem_stride`` and no max-pool (the
   images are small, as in the CIFAR variants of the paper's section 4.2; the
   workload's stride 2 takes 28x28 to 14x14, a quarter of the compute of stride 1 for
   the same parameters, as ImageNet ResNets' strided stem does);
2. four stages of two basic blocks each (two 3x3 convolutions with batch norm, a
   shortcut that is the identity or, where the stage halves the resolution and doubles
   the width, a strided 1x1 convolution with batch norm), widths ``w, 2w, 4w, 8w``;
3. global average pooling and one fully-connected layer to the classes.

With ``w = 64`` this is ResNet-18's 11.2 M parameters; the ``resnet`` workload's
``w = 16`` holds 0.70 M.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ResNet18"]


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, outputs: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                          nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10, channels: int = 1,
                 stem_stride: int = 1):
        super().__init__()
        stages, inputs = [], width
        for i, outputs in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if i == 0 else 2
            stages += [BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)]
            inputs = outputs
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, stem_stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(), *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8 * width, classes)

    def forward(self, x):
        return self.fc(self.features(x))

    def stanza_parts(self):
        """``(features, head)`` for Stanza: the residual body to the pooled features,
        and the classifier."""
        return self.features, self.fc
