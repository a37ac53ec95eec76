"""A plain Horovod training script whose only change is its import line.

The launch tests switch its strategy by the environment alone (``HVDX_COMPRESSION``,
``HVDX_SYNC``). It trains four steps on different data per rank and rank 0 prints
whether the replicas ended identical (gradient averaging: yes; DS-Sync's groups of two
among three ranks: no).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdx.torch as hvd  # was: import horovod.torch as hvd

hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

data = torch.Generator().manual_seed(hvd.rank())
for step in range(4):
    x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()

flat = torch.cat([p.detach().reshape(1, -1) for p in model.parameters()], dim=1)
replicas = hvd.allgather(flat, name="replicas")
if hvd.rank() == 0:
    identical = all(torch.equal(replicas[0], r) for r in replicas)
    # One string: horovodrun prefixes every write it forwards.
    print(f"replicas identical: {identical}", flush=True)
