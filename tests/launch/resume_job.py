"""Horovod's rank-0 resume recipe across two jobs, under every strategy and preset.

``python resume_job.py save DIR``: each strategy trains a model (with a layer that never
has a gradient) for 5 steps from the same weights, and rank 0 alone writes its model's
and optimizer's ``state_dict`` to ``DIR/<strategy>.pt``.

``python resume_job.py resume DIR``: a new job builds each model from other weights on
every rank, rank 0 alone loads the file, ``broadcast_parameters`` and
``broadcast_optimizer_state`` run on every rank, and training goes on for 5 steps. One
line per strategy: ``RESUMED <strategy> <the root's state everywhere> <one model after
training>``, each ``yes``/``no``/``n/a``; the job fails if any is ``no``.
"""

import pathlib
import sys

import torch
import torch.nn as nn

import hvdx
import hvdx.torch as hvd

STRATEGIES = {
    "horovod": lambda: {},
    "topk": lambda: {"compression": hvd.Compression.topk(0.1, 0.05, min_size=0)},
    "fast": lambda: {"compression": hvd.Compression.topk(preset="fast")},
    "safe": lambda: {"compression": hvd.Compression.topk(preset="safe")},
    "topk-momentum-sharded": lambda: {"compression": hvd.Compression.topk(
        0.1, 0.05, min_size=0, mode="sharded", momentum_correction=True)},
    "dssync": lambda: {"sync": hvdx.DSSync("shuffle", group_size=2, seed=3)},
    "decentralized": lambda: {"sync": hvdx.Decentralized()},
}
#: Gradient averaging: one model on every rank, always.
ONE_MODEL = ("horovod", "topk", "fast", "safe", "topk-momentum-sharded")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 130)  # above the presets' min_size: compressed
        self.out = nn.Linear(130, 2)
        self.unused = nn.Linear(3, 3)  # never a gradient

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def build(strategy, seed):
    torch.manual_seed(seed)
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02,
                                                   momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   **STRATEGIES[strategy]())
    return model, opt


def train(model, opt, steps):
    for step in steps:
        g = torch.Generator().manual_seed(1000 * step + hvd.rank())
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    if hasattr(opt, "finish_mixing"):
        opt.finish_mixing()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def everywhere(value, name):
    everyone = hvd.allgather_object(value, name=name)
    return all(torch.equal(v, everyone[0]) for v in everyone)


def main(phase, directory):
    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)
    failed = []
    for strategy in STRATEGIES:
        path = directory / f"{strategy}.pt"
        if phase == "save":
            model, opt = build(strategy, seed=0)
            train(model, opt, range(5))
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                           path)
            continue
        model, opt = build(strategy, seed=100 + hvd.rank())
        if hvd.rank() == 0:
            saved = torch.load(path, weights_only=False)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        roots = everywhere(flat(model), f"{strategy}.resumed")
        train(model, opt, range(5, 10))
        one = everywhere(flat(model), f"{strategy}.trained") \
            if strategy in ONE_MODEL or hvd.size() <= 2 else None
        verdicts = ["yes" if roots else "no", "n/a" if one is None else
                    "yes" if one else "no"]
        if hvd.rank() == 0:
            print("RESUMED", strategy, *verdicts, flush=True)
        failed += [strategy] if "no" in verdicts else []
    hvd.barrier()
    if failed:
        sys.exit(f"the ranks differ after resuming under {failed}")


if __name__ == "__main__":
    main(sys.argv[1], pathlib.Path(sys.argv[2]))
