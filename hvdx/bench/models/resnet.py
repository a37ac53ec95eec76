"""Two ResNets (He et al., CVPR 2016, "Deep Residual Learning for Image Recognition").

:class:`ResNet18` is ResNet-18's block structure, narrower, for 28x28 grey images (the
``resnet`` workload):

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

:class:`ResNet50` is torchvision's ``resnet50`` layer for layer (ResNet v1.5, the
model of Horovod's PyTorch synthetic benchmark), written here because torchvision is
not among hvdx's pins:

1. a 7x7 stride-2 stem convolution to 64 channels, batch norm, ReLU, a 3x3 stride-2
   max-pool;
2. four stages of 3, 4, 6 and 3 bottleneck blocks (a 1x1 convolution to the stage's
   width ``w``, a 3x3 one carrying the stage's stride, a 1x1 one to ``4 w``, each with
   batch norm; a shortcut that is the identity or a strided 1x1 convolution with batch
   norm), ``w`` = 64, 128, 256, 512;
3. global average pooling and one fully-connected layer, 2048 to the classes.

With 1000 classes that is 25,557,032 parameters (102 MB of fp32 gradients a step).
Modules, their names and their order are torchvision's, so that the parameters reach
``DistributedOptimizer`` under the same names and in the same order; so is the
initialisation (He normal, fan-out, for the convolutions; batch norm at 1 and 0).
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ResNet18", "ResNet50"]


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


class Bottleneck(nn.Module):
    """torchvision's ``Bottleneck``: 1x1 to ``width``, 3x3 with the stride, 1x1 to
    ``4 width``; ``downsample`` (or the identity) on the shortcut."""

    expansion = 4

    def __init__(self, inputs: int, width: int, stride: int = 1,
                 downsample: nn.Module = None):
        super().__init__()
        outputs = width * self.expansion
        self.conv1 = nn.Conv2d(inputs, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, outputs, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(y + shortcut)


class ResNet50(nn.Module):
    """ResNet-50 as torchvision's ``models.resnet50()`` builds it, for 224x224 RGB
    images (any size of at least 32 runs: the pooling is adaptive)."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.inputs = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._stage(64, 3, 1)
        self.layer2 = self._stage(128, 4, 2)
        self.layer3 = self._stage(256, 6, 2)
        self.layer4 = self._stage(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _stage(self, width: int, blocks: int, stride: int) -> nn.Sequential:
        outputs = width * Bottleneck.expansion
        downsample = None
        if stride != 1 or self.inputs != outputs:
            downsample = nn.Sequential(nn.Conv2d(self.inputs, outputs, 1, stride, bias=False),
                                       nn.BatchNorm2d(outputs))
        layers = [Bottleneck(self.inputs, width, stride, downsample)]
        self.inputs = outputs
        layers += [Bottleneck(outputs, width) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))
