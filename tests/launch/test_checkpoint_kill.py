"""save_checkpoint writes atomically: a job killed with SIGKILL while it writes leaves
the last complete checkpoint, which loads."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import torch

WRITER = """
import sys, torch, torch.nn as nn
import hvdx.torch as hvd
hvd.init()
model = nn.Linear(1000, 2000)  # 8 MB: each write takes a while, so the kill lands in one
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for i in range(100000):
    with torch.no_grad():
        model.weight.fill_(float(i))
    hvd.save_checkpoint(sys.argv[1], model, opt, i=i)
    print(i, flush=True)
"""


def test_the_last_checkpoint_written_before_a_sigkill_loads(tmp_path):
    path = tmp_path / "ckpt.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    saved = []
    deadline = time.monotonic() + 120
    while len(saved) < 5 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        saved.append(int(line))
    time.sleep(0.013)  # somewhere inside a later write
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rest = proc.stdout.read().split()
    saved += [int(x) for x in rest]
    assert len(saved) >= 5, "the writer did not get going"
    content = torch.load(path, weights_only=False)
    mine = content["ranks"][0]
    i = mine["extra"]["i"]
    # The last save that returned, or the one whose rename landed just before the kill.
    assert saved[-1] <= i <= saved[-1] + 1
    assert torch.all(mine["model"]["weight"] == float(i))
    leftovers = [p.name for p in pathlib.Path(tmp_path).iterdir() if p.name != "ckpt.pt"]
    assert all(name.endswith(".tmp") for name in leftovers)  # at most the interrupted one
