"""Train a small CNN on the digits data set with Horovod and PyTorch, through hvdx.

A plain Horovod script. With ``--strategy none`` the only hvdx change is the import:

    import hvdx.torch as hvd        # was: import horovod.torch as hvd

Each other strategy switches on one hvdx feature (README.md):

    topk           DistributedOptimizer(..., compression=hvd.Compression.topk(preset="safe"))
    dssync         hvd.init(process_sets="dynamic"); DistributedOptimizer(..., sync=hvdx.DSSync())
    decentralized  DistributedOptimizer(..., sync=hvdx.Decentralized("one-peer-exp"))
    stanza         hvd.Stanza(features, head, optimizer): a trainer instead of an optimizer
                   (at least 2 ranks: the last one trains the head)

Run:  mpirun -n 4 python examples/torch_digits.py --strategy dssync
 on GPUs: mpirun -n 4 python examples/torch_digits.py --strategy topk --device cuda
 or:  horovodrun -np 4 python examples/torch_digits.py --checkpoint digits.pt
 and  HOROVOD_CYCLE_TIME=50 mpirun -n 4 python examples/torch_digits.py --strategy topk
      (TopK's presets leave Horovod nothing to carry during a step: a 50 ms cycle
      gives its background loop's CPU back to training)
Across hosts: examples/multi_host.sh.
"""

import argparse
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdx
import hvdx.torch as hvd  # the one-line change; was: import horovod.torch as hvd
from hvdx.datasets import digits  # scikit-learn's 8x8 digits: no download

STRATEGIES = ("none", "topk", "dssync", "decentralized", "stanza")


class DigitsCNN(nn.Module):
    """Two conv layers (the features) and two fully connected layers (the head)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))


def distributed_optimizer(optimizer, model, strategy):
    """Horovod's DistributedOptimizer, with the hvdx argument of ``strategy``."""
    options = {}
    if strategy == "topk":  # 1% up, 2% down: steadier late in a run than preset="fast"
        options["compression"] = hvd.Compression.topk(preset="safe")
    elif strategy in ("dssync", "decentralized"):
        options["sync"] = hvdx.DSSync() if strategy == "dssync" else \
            hvdx.Decentralized(graph="one-peer-exp")
        # Averaged with the parameters: BatchNorm statistics (this model has none).
        options["named_buffers"] = model.named_buffers()
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    **options)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=STRATEGIES, default="none")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="default: one pass over the training data")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.025,
                        help="for one rank; scaled by the ranks that read data")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="saved after every epoch; the run resumes from it if it exists")
    parser.add_argument("--device", default="cpu",
                        help="cpu, cuda (each rank the GPU of its local rank, shared in "
                             "turn when the ranks outnumber the GPUs) or cuda:N")
    args = parser.parse_args(argv)

    # (Calling hvd.init() again in a job that has initialised Horovod, as the tests of
    # this example do, changes nothing: Horovod initialises once per process.)
    if args.strategy == "dssync":
        hvd.init(process_sets="dynamic")  # DS-Sync registers a process set per group
    else:
        hvd.init()
    torch.set_num_threads(1)  # one thread per rank: the ranks share the host's cores
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())

    model = DigitsCNN().to(device)  # built on the CPU first: the same weights anywhere
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    if args.strategy == "stanza":
        # Conv ranks train the features, the last rank the head; only conv ranks read
        # data, and one step trains on their global batch. Stanza starts every rank
        # from rank 0's model itself.
        trainer = hvd.Stanza(model.features, model.head, optimizer, fc_workers=1)
        readers = list(trainer.roles.conv_ranks)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * len(readers)
        state = (trainer,)  # what the checkpoint holds
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = distributed_optimizer(optimizer, model, args.strategy)
        readers = list(range(size))
        state = (model, optimizer)
    mixing = args.strategy in ("dssync", "decentralized")  # every rank its own parameters

    start = 0
    # The file lives where rank 0 writes it: rank 0 says whether there is one.
    if args.checkpoint and hvd.broadcast_object(os.path.exists(args.checkpoint), root_rank=0):
        start = hvd.load_checkpoint(args.checkpoint, *state)["epoch"]  # each rank its own
        if rank == 0:
            print(f"resumed from {args.checkpoint} after epoch {start}", flush=True)

    full = digits()
    reads = rank in readers
    data = full.shard(readers.index(rank) if reads else 0, len(readers))
    x_train, y_train = (torch.from_numpy(a).to(device) for a in (data.x_train, data.y_train))
    x_test, y_test = (torch.from_numpy(a).to(device) for a in (full.x_test, full.y_test))
    # Every rank takes the same number of steps (the collectives must match): the
    # smallest shard holds len // readers samples.
    steps = args.steps_per_epoch or len(full.x_train) // len(readers) // args.batch_size

    def evaluate():
        """Test accuracy on rank 0 (None elsewhere); collective."""
        if args.strategy == "stanza":
            whole = trainer.full_model(rank=0)  # features and head together, on rank 0
        else:
            if mixing:
                optimizer.synchronize_parameters()  # the average over all ranks
            whole = model if rank == 0 else None
        if whole is None:
            return None
        whole.eval()
        with torch.no_grad():
            accuracy = (whole(x_test).argmax(1) == y_test).float().mean().item()
        whole.train()
        return accuracy

    step_times = []
    for epoch in range(start, args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, rank, epoch])
                                 .permutation(len(x_train))).to(device)
        for step in range(steps):
            i = step % (len(x_train) // args.batch_size)
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            begin = time.perf_counter()
            if args.strategy == "stanza":
                loss = trainer.step(x_train[idx], y_train[idx]) if reads else trainer.step()
            else:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                loss = loss.item()
            step_times.append(time.perf_counter() - begin)
        accuracy = evaluate()
        if args.checkpoint:  # every rank: each rank's state, in one file on rank 0
            hvd.save_checkpoint(args.checkpoint, *state, epoch=epoch + 1)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss:.4f}  "
                  f"test accuracy {accuracy:.4f}", flush=True)
    if start >= args.epochs:  # resumed after the last epoch: nothing left to train
        accuracy = evaluate()
    if rank == 0:
        step_ms = f"{1000 * np.median(step_times):.2f} ms" if step_times else "-"
        print(f"ranks {size}  strategy {args.strategy}  device {device}  final test accuracy "
              f"{accuracy:.4f}  median time per step {step_ms}", flush=True)


if __name__ == "__main__":
    main()
