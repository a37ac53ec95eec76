"""A small training job in which one rank fails mid-run: the launcher tests' subject.

    python failing_job.py STRATEGY HOW STAMP

STRATEGY: horovod, topk, dssync or decentralized; HOW: raise (an uncaught exception)
or kill (SIGKILL, as the out-of-memory killer would); STAMP: a file where the failing
rank writes the time it fails, so the test can measure how long the job takes to end
after it. Rank 1 fails at step 3; the other ranks go on into their next collective,
where they would wait forever if nothing ended the job.
"""

import os
import signal
import sys
import time

import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd


def optimizer_for(strategy, model):
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    if strategy == "horovod":
        kwargs = {}
    elif strategy == "topk":
        kwargs = {"compression": hvd.Compression.topk(0.1, 0.1, min_size=0)}
    elif strategy == "dssync":
        kwargs = {"sync": hvdx.DSSync("shuffle", group_size=2, seed=0)}
    elif strategy == "decentralized":
        kwargs = {"sync": hvdx.Decentralized("one-peer-exp")}
    else:
        raise SystemExit(f"unknown strategy {strategy!r}")
    return hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **kwargs)


def main(strategy, how, stamp):
    hvd.init(process_sets="dynamic" if strategy == "dssync" else None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = optimizer_for(strategy, model)
    for step in range(1000):
        if step == 3 and hvd.rank() == 1:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank one fails at step {step}")
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.05)  # steps of a realistic length: the failure lands mid-run


if __name__ == "__main__":
    main(*sys.argv[1:4])
