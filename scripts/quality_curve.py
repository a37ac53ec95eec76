"""One workload's quality curve under the compression or sync in the job's environment.

A tool for tuning presets, not part of the benchmark: the bench times strategies by
name, this trains one workload of :mod:`hvdx.bench.workloads` under whatever
``HVDX_COMPRESSION`` / ``HVDX_SYNC`` says (any ratio, any setting) and prints, on rank
0, one JSON line with the quality every ``--eval-every`` steps::

    HVDX_COMPRESSION="topk(ratio=0.2, downlink_ratio=0.2, selection='global')" \\
        mpirun -n 2 python scripts/quality_curve.py --workload lm --batch 8 --steps 80

1. every rank builds the workload's model (seeded alike; rank 0's weights broadcast),
   its optimizer (SGD with momentum at lr x ranks, or AdamW, as the bench) with its
   learning-rate warm-up, and its shard of the training data;
2. ``--batch`` samples per rank per step (default: the workload's), in a permutation
   per epoch seeded by the rank, as the bench's runner;
3. the quality on the whole test split, averaged over the ranks, every
   ``--eval-every`` steps and at the last, each also on rank 0's standard error as it
   comes.
"""

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

import hvdx.torch as hvd
from hvdx.bench.workloads import WORKLOADS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="lm", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=0,
                        help="samples per rank per step (default: the workload's)")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lr-warmup-steps", type=int,
                        help="the learning rate's warm-up (default: the workload's)")
    parser.add_argument("--lr", type=float,
                        help="the learning rate for one rank (default: the workload's)")
    args = parser.parse_args()

    workload = WORKLOADS[args.workload]
    if args.lr_warmup_steps is not None:
        workload = dataclasses.replace(workload, lr_warmup_steps=args.lr_warmup_steps)
    if args.lr is not None:
        workload = dataclasses.replace(workload, lr=args.lr)
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    full = workload.data()
    x_test, y_test = torch.from_numpy(full.x_test), torch.from_numpy(full.y_test)
    model = workload.make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    local = workload.make_optimizer(model.parameters(), size)
    schedule = workload.make_schedule(local)
    optimizer = hvd.DistributedOptimizer(local, named_parameters=model.named_parameters())
    batch = args.batch or workload.batch_size
    data = full.shard(rank, size)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    rng = np.random.default_rng(args.seed + rank)
    per_epoch, order = len(x) // batch, rng.permutation(len(x))
    curve, started = [], time.time()
    for step in range(1, args.steps + 1):
        i = (step - 1) % per_epoch
        if i == 0 and step > 1:
            order = rng.permutation(len(x))
        idx = torch.from_numpy(order[i * batch:(i + 1) * batch])
        optimizer.zero_grad()
        workload.loss(model(x[idx]), y[idx]).backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            quality = workload.quality(model, x_test, y_test)
            model.train()
            quality = hvd.allreduce(torch.tensor(quality), name="quality").item()
            curve.append((step, round(quality, 4)))
            if rank == 0:  # progress on a long run; the JSON line comes at the end
                print(f"step {step}/{args.steps}: {quality:.4f} "
                      f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    if rank == 0:
        print(json.dumps({
            "workload": args.workload, "ranks": size, "batch": batch,
            "compression": os.environ.get("HVDX_COMPRESSION", "none"),
            "sync": os.environ.get("HVDX_SYNC", "none"), "curve": curve,
            "wall_s": round(time.time() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
