"""``hvdx bench --script`` with a mixer the script defines and registers itself
(``hvdx.register_mixer``), chosen by ``HVDX_SYNC=<name>(...)`` (localhost, 2 ranks)."""

import json
import sys

import pytest

from test_launchers import run

pytestmark = [pytest.mark.user_mixer]

#: A Horovod script that defines and registers a mixer of its own (a random partner per
#: step, seeded alike on every rank): hvdx bench knows nothing of it but the value.
OWN_MIXER = '''
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd
import hvdx


class RandomPartner(hvdx.Mixer):
    def __init__(self, seed=0):
        self.seed = seed

    def settings(self):
        return {"seed": self.seed}

    def matrix(self, step, size):
        order = np.random.default_rng([self.seed, step]).permutation(size)
        w = np.eye(size)
        for a, b in zip(order[0::2], order[1::2]):
            w[[a, a, b, b], [a, b, a, b]] = 0.5
        return w


hvdx.register_mixer("random_partner", RandomPartner)
hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
data = torch.Generator().manual_seed(hvd.rank())
for step in range(4):
    x, y = torch.randn(16, 64, generator=data), torch.randint(0, 10, (16,), generator=data)
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
if os.environ.get("HVDX_SYNC", "none") != "none":  # the mixer ran, every step
    assert type(optimizer.hvdx_strategy).__name__ == "UserMixing", optimizer.hvdx_strategy
    assert optimizer.state_dict()["hvdx_mixer"]["step"] == 4
'''


def test_a_mixer_the_script_registers_runs_as_a_strategy_by_its_variable(tmp_path):
    script = tmp_path / "own_mixer.py"
    script.write_text(OWN_MIXER)
    out = tmp_path / "bench"
    proc, _ = run([sys.executable, "-m", "hvdx.cli", "bench", "--localhost", "--ranks", "2",
                   "--script", str(script), "--strategies",
                   "horovod,HVDX_SYNC=random_partner(seed=3)", "--out", str(out)],
                  timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    horovod, own = data["summary"]
    assert own["strategy"] == "HVDX_SYNC=random_partner(seed=3)"
    assert own["steps"] == horovod["steps"] == 4 and own["median_step_s"] > 0
    log = (out / "own_mixer-HVDX_SYNC_random_partner_seed_3.log").read_text()
    assert "HVDX_SYNC='random_partner(seed=3)'" in log
