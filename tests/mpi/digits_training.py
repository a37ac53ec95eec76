"""Training the digits CNN to the end, for the convergence tests of TopK and DS-Sync.

The examples' and the benchmark's small CNN, trained on every rank of the job with the
same seed, data order, optimizer and number of epochs whatever the synchronization, so
that only the synchronization differs between two calls.
"""

import numpy as np
import torch
import torch.nn.functional as F

from hvdx.bench.workloads import DigitsCNN
from hvdx.datasets import digits

EPOCHS = 20
BATCH = 32
# Per rank (scaled by the number of ranks), as in the benchmark's digits_cnn workload,
# annealed by a cosine to 0 over the run: the final accuracy is then that of a finished
# run rather than of one noisy step (without the annealing, dense SGD with momentum 0.9
# at this rate diverges on some data orders).
LR = 0.025


def train(hvd, distributed, epochs=EPOCHS, seed=0, before_evaluation=None):
    """Mean test accuracy over the ranks after ``epochs`` epochs.

    Args:
        hvd: ``hvdx.torch``, initialised.
        distributed: ``(local optimizer, model) -> distributed optimizer``.
        before_evaluation: called with the distributed optimizer after the last step.
    """
    torch.manual_seed(seed)
    rank, size = hvd.rank(), hvd.size()
    full = digits()
    data = full.shard(rank, size)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    model = DigitsCNN()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = distributed(torch.optim.SGD(model.parameters(), lr=LR * size, momentum=0.9), model)
    per_epoch = len(x) // BATCH
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * per_epoch)
    rng = np.random.default_rng(seed + rank)
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        for i in range(per_epoch):
            idx = order[i * BATCH:(i + 1) * BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            schedule.step()
    if before_evaluation is not None:
        before_evaluation(opt)
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(full.x_test)).argmax(1) ==
                    torch.from_numpy(full.y_test)).float().mean()
    return hvd.allreduce(accuracy, name="convergence.accuracy").item()
