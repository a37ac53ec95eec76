"""Horovod's PyTorch synthetic benchmark: a model, random data, ``DistributedOptimizer``,
a timed loop that prints ``Iter #N: X img/sec per CPU``.

Modeled on Horovod 0.28.1's ``examples/pytorch/pytorch_synthetic_benchmark.py``: the
same flags (``--model``, ``--batch-size``, ``--num-warmup-batches``,
``--num-batches-per-iter``, ``--num-iters``, ``--fp16-allreduce``, ``--use-adasum``),
the same steps and the same output. It imports Horovod, not hvdx: it is the kind of
script ``hvdx bench --script`` runs unchanged, and ``hvdx bench --full`` runs it with
``--model resnet50``::

    hvdx bench --script examples/pytorch_synthetic_benchmark.py \\
        --strategies horovod,fast,dssync,decentralized
    hvdx bench --script examples/pytorch_synthetic_benchmark.py \\
        --script-args "--model resnet50 --batch-size 4 --num-warmup-batches 1 \\
        --num-batches-per-iter 2 --num-iters 2"
    mpirun -n 4 python examples/pytorch_synthetic_benchmark.py   # plain Horovod

Where it differs from Horovod's:

1. ``--model`` defaults to ``small_cnn``, two convolutions and a 2048 x 256 FC layer on
   32 x 32 images, 10 classes: 0.53 M parameters (2.1 MB of gradients per step, 99% of
   them in the FC layers), so that a default run suits a few CPU cores.
   Horovod's default, ``--model resnet50``, runs as there on 224 x 224 images and 1000
   classes; its model comes from torchvision where torchvision imports, as in Horovod,
   else from hvdx (:class:`hvdx.bench.models.resnet.ResNet50`, torchvision's layer
   list: 25,557,032 parameters), since no torchvision is among hvdx's pins. Other
   torchvision names need torchvision.
2. On a GPU each rank takes its local rank's device, in turn where the ranks outnumber
   the GPUs (Horovod's: one GPU per rank); ``--no-cuda`` as Horovod's. No
   ``cudnn.benchmark``.
3. The optimizer is SGD with momentum 0.9 (Horovod's: plain SGD), the optimizer of this
   script's earlier measurements; the learning rate is Horovod's, ``0.01 x size``.
4. The model's initial weights come from ``torch.manual_seed(42)`` (Horovod's: unseeded;
   rank 0's weights are broadcast in both).
5. img/sec is printed with three decimals (Horovod's: one): on CPU cores ResNet-50
   trains well under 1 image per second per rank, where one decimal is too coarse for
   ``hvdx bench``'s ratios.
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true",
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="small_cnn",
                    help="model to benchmark: small_cnn, resnet50, or (where torchvision "
                         "imports) any torchvision model")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--use-adasum", action="store_true", help="use adasum algorithm")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()


class SmallCNN(nn.Module):
    """32 x 32 RGB images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def build_model(name):
    """``(model, image side, classes)`` for ``--model``: the small CNN, else torchvision's
    model of that name as Horovod's script builds it, else hvdx's ResNet-50."""
    if name == "small_cnn":
        return SmallCNN(), 32, 10
    try:
        from torchvision import models
    except ImportError:  # not among hvdx's pins: the same layer list, written in hvdx
        if name != "resnet50":
            parser.error(f"--model {name} needs torchvision (without it: small_cnn, "
                         "resnet50)")
        from hvdx.bench.models.resnet import ResNet50

        return ResNet50(), 224, 1000
    return getattr(models, name)(), 224, 1000


hvd.init()
torch.manual_seed(42)

if args.cuda:
    # Horovod: pin GPU to local rank (in turn, where the ranks outnumber the GPUs).
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())

model, image_size, classes = build_model(args.model)
if args.cuda:
    # Move model to GPU.
    model.cuda()
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler, momentum=0.9)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Set up fixed fake data
data = torch.randn(args.batch_size, 3, image_size, image_size)
target = torch.LongTensor(args.batch_size).random_() % classes
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


log("Model: %s (%d parameters)" % (args.model, sum(p.numel() for p in model.parameters())))
log("Batch size: %d" % args.batch_size)
device = "GPU" if args.cuda else "CPU"
log("Number of %ss: %d" % (device, hvd.size()))

# Warm-up
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

# Benchmark
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log("Iter #%d: %.3f img/sec per %s" % (x, img_sec, device))
    img_secs.append(img_sec)

# Results
img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log("Img/sec per %s: %.3f +-%.3f" % (device, img_sec_mean, img_sec_conf))
log("Total img/sec on %d %s(s): %.3f +-%.3f" %
    (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))
