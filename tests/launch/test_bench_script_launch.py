"""``hvdx bench --script``: Horovod's kind of synthetic benchmark, unchanged on disk,
under Horovod and a tuned TopK on localhost (2 ranks, a few steps)."""

import csv
import json
import sys

import pytest

from test_launchers import ROOT, run

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.sign]

SCRIPT = ROOT / "examples" / "pytorch_synthetic_benchmark.py"


def test_a_horovod_script_runs_under_horovod_and_topk_with_step_times_and_bytes(tmp_path):
    before = SCRIPT.read_bytes()
    out = tmp_path / "bench"
    proc, _ = run([sys.executable, "-m", "hvdx.cli", "bench", "--localhost", "--ranks", "2",
                   "--script", str(SCRIPT), "--strategies", "horovod,fast",
                   "--script-args", "--batch-size 8 --num-warmup-batches 1 "
                   "--num-batches-per-iter 2 --num-iters 2", "--out", str(out)],
                  timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert SCRIPT.read_bytes() == before  # the copy was switched, not the script
    assert "import horovod.torch as hvd -> import hvdx.torch as hvd" in proc.stdout
    assert "note: no floor for a script" in proc.stdout
    assert "pytorch_synthetic_benchmark / fast: Iter #1:" in proc.stdout  # progress
    table = proc.stdout[proc.stdout.index("\nlocalhost"):]
    assert " horovod " in table and " fast " in table

    data = json.loads((out / "results.json").read_text())
    horovod, topk = data["summary"]
    assert [horovod["strategy"], topk["strategy"]] == ["horovod", "fast"]
    for row in (horovod, topk):
        # Warm-up 1 + 2 x 2 timed, and the step broadcast_optimizer_state takes to make
        # the optimizer's state.
        assert row["steps"] == 6, row
        assert row["median_step_s"] > 0 and row["wall_s"] > row["median_step_s"]
        assert row["img_per_s"] > 0 and row["final_accuracy"] is None
    assert topk["step_speedup"] is not None and horovod["step_speedup"] == 1.0
    # TopK really ran: rank 0 said so, and hvdx's count is far below the allreduce's.
    log = (out / "pytorch_synthetic_benchmark-fast.log").read_text()
    assert "[hvdx] HVDX_COMPRESSION='fast': bidirectional TopK, ratio=0.01" in log
    assert "HVDX_COMPRESSION='none'" in (out / "pytorch_synthetic_benchmark-horovod.log").read_text()
    assert topk["hvdx_bytes_per_step"] < 0.05 * horovod["hvdx_bytes_per_step"]
    with open(out / "results.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["horovod", "fast"]
    assert (out / "results.png").stat().st_size > 0


#: A Horovod script that defines and registers a compressor of its own (scaled signSGD),
#: as a user would: hvdx bench knows nothing of it but the variable's value.
OWN_COMPRESSOR = '''
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd
import hvdx
from hvdx.core.user_compression import Compressor


class ScaledSign(Compressor):
    def __init__(self, scale=1.0):
        self.scale = scale

    def compress(self, x, step, name):
        return [np.signbit(x), np.array(np.abs(x).mean(), x.dtype)]

    def decompress(self, payloads, shape, dtype, step, name):
        negative, mean = payloads
        return np.where(negative, -1.0, 1.0).astype(dtype) * (mean * dtype.type(self.scale))

    def settings(self):
        return {"scale": self.scale}


hvdx.register_compressor("scaled_sign", ScaledSign)
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
'''


def test_a_compressor_the_script_registers_runs_as_a_strategy_by_its_variable(tmp_path):
    script = tmp_path / "own_compressor.py"
    script.write_text(OWN_COMPRESSOR)
    out = tmp_path / "bench"
    proc, _ = run([sys.executable, "-m", "hvdx.cli", "bench", "--localhost", "--ranks", "2",
                   "--script", str(script), "--strategies",
                   "horovod,HVDX_COMPRESSION=scaled_sign(scale=0.5)", "--out", str(out)],
                  timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    horovod, own = data["summary"]
    assert own["strategy"] == "HVDX_COMPRESSION=scaled_sign(scale=0.5)"
    assert own["steps"] == horovod["steps"] == 4 and own["median_step_s"] > 0
    log = (out / "own_compressor-HVDX_COMPRESSION_scaled_sign_scale_0.5.log").read_text()
    assert "HVDX_COMPRESSION='scaled_sign(scale=0.5)'" in log
    # hvdx's count: per tensor one sign per entry (a byte, pickled) and the mean, far
    # below the 4 bytes per entry of the allreduce's count.
    assert 0 < own["hvdx_bytes_per_step"] < 0.5 * horovod["hvdx_bytes_per_step"]
