"""The benchmark's models, one a module: :mod:`.digits` (the two small networks on
8x8 digits), :mod:`.transformer` (a GPT-2-shaped byte language model) and
:mod:`.resnet` (ResNet-18's block structure, narrower, and torchvision's ResNet-50 for
Horovod's synthetic benchmark)."""
