"""Run the examples of examples/ inside a running MPI test job, briefly.

Each example exposes ``main(argv)``; a test imports it by path and calls it on every
rank of the job pytest-mpi started (whose conftest initialised Horovod: the example's
own ``hvd.init()`` changes nothing then), instead of paying for one more ``mpirun`` and
framework import per example and strategy. One call of :func:`run_and_resume`:

1. ``main`` for one epoch of :data:`STEPS` steps, with a checkpoint: rank 0 printed a
   final test accuracy between 0 and 1, and the checkpoint file exists;
2. ``main`` again with two epochs and the same checkpoint: it resumed after epoch 1
   and trained epoch 2 only, then printed its final accuracy.

At 2 ranks only (Stanza needs two; more add time, not coverage): the other sizes skip.
"""

import importlib.util
import os
import pathlib
import re

import pytest
from mpi4py import MPI

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
STEPS = 3
#: Where the examples run: at 2 ranks.
TWO_RANKS = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 2,
                               reason="the examples run at 2 ranks only (kept short)")


def load(name: str):
    """``examples/<name>.py`` as a module (not run as a script)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def final_accuracy(output: str) -> float:
    found = re.findall(r"final test accuracy (\S+)", output)
    assert len(found) == 1, output
    accuracy = float(found[0])
    assert 0.0 <= accuracy <= 1.0, output
    return accuracy


def run_and_resume(name: str, strategy: str, tmp_path, capsys) -> None:
    """Steps 1 and 2 of the module docstring, on every rank; checked on rank 0."""
    main = load(name).main
    rank = MPI.COMM_WORLD.Get_rank()
    path = MPI.COMM_WORLD.bcast(str(tmp_path / f"{name}-{strategy}.ckpt"), root=0)
    argv = ["--strategy", strategy, "--steps-per-epoch", str(STEPS), "--checkpoint", path]

    main(argv + ["--epochs", "1"])
    first = capsys.readouterr().out
    if rank == 0:
        final_accuracy(first)
        assert "resumed" not in first, first
        assert os.path.getsize(path) > 0

    main(argv + ["--epochs", "2"])
    second = capsys.readouterr().out
    if rank == 0:
        assert f"resumed from {path} after epoch 1" in second, second
        assert not re.search(r"\bepoch 1/2\b", second, re.I), second  # not trained again
        assert re.search(r"\bepoch 2/2\b", second, re.I), second
        final_accuracy(second)
    MPI.COMM_WORLD.Barrier()
