"""Train a small CNN on the digits data set with Horovod, through hvdx.

A plain Horovod PyTorch script. The only hvdx change is the import line:

    import hvdx.torch as hvd        # was: import horovod.torch as hvd

Run:  mpirun -n 4 python examples/torch_digits.py
 or:  horovodrun -np 4 python examples/torch_digits.py
"""

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import hvdx.torch as hvd  # the one-line change; was: import horovod.torch as hvd
from hvdx.bench.workloads import DigitsCNN  # two conv and two FC layers, 8x8 inputs
from hvdx.datasets import digits


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.025, help="for one rank; scaled by size")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    full = digits()
    data = full.shard(hvd.rank(), hvd.size())
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)

    model = DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    # Every rank takes the same number of steps (Horovod needs matching collectives):
    # the smallest shard holds len // size samples.
    steps_per_epoch = len(full.x_train) // hvd.size() // args.batch_size
    rng = np.random.default_rng(args.seed + hvd.rank())
    step_times = []
    for epoch in range(args.epochs):
        model.train()
        order = torch.from_numpy(rng.permutation(len(x_train)))
        for step in range(steps_per_epoch):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss.item():.4f}  "
                  f"test accuracy {accuracy:.4f}", flush=True)
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}  final test accuracy {accuracy:.4f}  "
              f"median time per step {1000 * np.median(step_times):.2f} ms")


if __name__ == "__main__":
    main()
