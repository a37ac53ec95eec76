"""``hvdx bench --full`` ends with Horovod's PyTorch synthetic benchmark on ResNet-50
through ``--script``: planned (and the script checked) before the workloads, run after
them under Horovod and every strategy the environment switches a script to. Nothing is
launched here: the two runners are replaced by recorders."""

import inspect
from pathlib import Path

import pytest

from hvdx.bench import cli, harness, script_run

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def calls(monkeypatch):
    """The runs ``hvdx bench`` asked for, in order: ``("workloads", strategies)`` and
    ``("script", keyword arguments)``."""
    made = []
    real = inspect.signature(script_run.run_script_bench)

    def workloads(spec, workloads, strategies, *args, **kwargs):
        made.append(("workloads", list(strategies)))
        return []

    def script(spec, path, script_args, strategies, out_dir, **kwargs):
        real.bind(spec, path, script_args, strategies, out_dir, **kwargs)  # its arguments
        made.append(("script", dict(spec=spec, path=path, script_args=script_args,
                                    strategies=strategies, out=out_dir, **kwargs)))
        return []

    monkeypatch.setattr(harness, "run_bench", workloads)
    monkeypatch.setattr(script_run, "run_script_bench", script)
    return made


def test_full_runs_horovods_resnet50_benchmark_after_the_workloads(tmp_path, calls, capsys):
    out = tmp_path / "out"
    assert cli.main(["--full", "--localhost", "--ranks", "2", "--out", str(out)]) == 0
    assert [kind for kind, _ in calls] == ["workloads", "script"]
    script = calls[1][1]
    assert Path(script["path"]) == ROOT / "examples" / "pytorch_synthetic_benchmark.py"
    assert script["script_args"] == ["--model", "resnet50", "--batch-size", "4",
                                      "--num-warmup-batches", "1",
                                      "--num-batches-per-iter", "1", "--num-iters", "2"]
    # The full run's strategies, less Stanza, which needs code; Horovod first.
    assert script["strategies"] == ["horovod", "topk", "fast", "safe", "dssync",
                                    "decentralized"]
    assert calls[0][1] == ["horovod", "topk", "fast", "safe", "dssync", "decentralized",
                           "stanza"]
    # Its own directory, so that the workloads' results.json stays.
    assert Path(script["out"]) == out / "resnet50"
    assert script["spec"] is None and script["localhost_ranks"] == 2
    assert script["placements"] == ["blocked"]
    notes = " ".join(script["notes"])
    assert "stanza skipped: Stanza needs code" in notes and "no floor for a script" in notes
    printed = capsys.readouterr().out
    assert "Horovod's PyTorch synthetic benchmark, ResNet-50" in printed
    assert f"written: {out / 'resnet50'}/results.json" in printed


def test_the_default_run_runs_no_script(tmp_path, calls):
    assert cli.main(["--localhost", "--out", str(tmp_path / "out")]) == 0
    assert [kind for kind, _ in calls] == ["workloads"]


def test_full_keeps_of_the_named_strategies_those_a_script_can_take(tmp_path, calls):
    assert cli.main(["--full", "--localhost", "--no-floor", "--out", str(tmp_path),
                     "--strategies", "dssync,stanza,topk_masked"]) == 0
    script = calls[1][1]
    assert script["strategies"] == ["horovod", "dssync", "safe"]
    assert [n.split(":")[0] for n in script["notes"]] == ["stanza skipped"]


def test_a_script_that_cannot_be_switched_stops_full_before_the_workloads(
        tmp_path, calls, monkeypatch, capsys):
    def refused(path):
        raise ValueError(f"{path} imports no Horovod framework module")

    monkeypatch.setattr(script_run, "prepare", refused)
    assert cli.main(["--full", "--localhost", "--out", str(tmp_path)]) == 2
    assert "pytorch_synthetic_benchmark.py imports no Horovod" in capsys.readouterr().err
    assert calls == []


def test_without_the_example_beside_hvdx_full_says_how_to_run_it_and_goes_on(
        tmp_path, calls, monkeypatch, capsys):
    monkeypatch.setattr(cli, "SYNTHETIC_BENCHMARK", "examples/not_here.py")
    assert cli.main(["--full", "--localhost", "--out", str(tmp_path)]) == 0
    assert [kind for kind, _ in calls] == ["workloads"]
    printed = capsys.readouterr().out
    assert "note: Horovod's synthetic benchmark on ResNet-50 skipped: no " \
           "examples/not_here.py beside this hvdx" in printed
    assert f'--script-args "{cli.RESNET50_ARGS}"' in printed
