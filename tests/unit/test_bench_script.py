"""``hvdx bench --script``'s pure parts: switching a script's Horovod imports, the
strategies a script can be switched to by the environment, the step log and the row."""

import types

import pytest

from hvdx import environment, step_log
from hvdx.bench import script_run
from hvdx.bench.cli import main
from hvdx.bench.script import (SCRIPT_STRATEGIES, parse_throughput, script_strategies,
                               strategy_environment, switch_imports)

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza,
              pytest.mark.sign]


# --- switching the imports ---------------------------------------------------------------

@pytest.mark.parametrize("line, switched", [
    ("import horovod.torch as hvd", "import hvdx.torch as hvd"),
    ("import horovod.tensorflow as hvd", "import hvdx.tensorflow as hvd"),
    ("import horovod.tensorflow.keras as hvd", "import hvdx.tensorflow.keras as hvd"),
    ("from horovod import torch as hvd", "from hvdx import torch as hvd"),
    ("from horovod.tensorflow import keras as hvd", "from hvdx.tensorflow import keras as hvd"),
    ("from horovod.torch import DistributedOptimizer, init",
     "from hvdx.torch import DistributedOptimizer, init"),
    ("import os, horovod.torch as hvd", "import os, hvdx.torch as hvd"),
])
def test_each_form_of_the_horovod_import_is_switched(line, switched):
    source = f"import sys\n{line}  # Horovod\nprint(hvd)\n"
    out, changes = switch_imports(source, "train.py")
    assert out == f"import sys\n{switched}  # Horovod\nprint(hvd)\n"
    assert changes == [f"line 2: {line}  # Horovod -> {switched}"]


def test_only_import_statements_change_and_the_rest_is_kept_byte_for_byte():
    source = ('"""Run: import horovod.torch as hvd"""\n'
              "s = 'import horovod.torch as hvd'  # import horovod.torch as hvd\n"
              "if True:\n"
              "    from horovod.torch import (allreduce,\n"
              "                               init)   # two lines\n"
              "    import horovod.torch as hvd\n"
              "from horovod.torch.mpi_ops import allgather  # Horovod's own op: kept\n"
              "import horovod\n"
              "x = 'é'; import horovod.torch as h2\n")
    out, changes = switch_imports(source, "train.py")
    assert out == ('"""Run: import horovod.torch as hvd"""\n'
                   "s = 'import horovod.torch as hvd'  # import horovod.torch as hvd\n"
                   "if True:\n"
                   "    from hvdx.torch import allreduce, init   # two lines\n"
                   "    import hvdx.torch as hvd\n"
                   "from horovod.torch.mpi_ops import allgather  # Horovod's own op: kept\n"
                   "import horovod\n"
                   "x = 'é'; import hvdx.torch as h2\n")
    assert [c.split(":")[0] for c in changes] == ["line 4", "line 6", "line 9"]


def test_a_script_that_already_imports_hvdx_is_left_as_it_is():
    source = "import hvdx.torch as hvd\nhvd.init()\n"
    assert switch_imports(source, "train.py") == (source, [])
    source = "from hvdx import torch as hvd\n"
    assert switch_imports(source, "train.py") == (source, [])


@pytest.mark.parametrize("source, words", [
    ("import torch\nprint('horovod.torch')\n", "train.py imports no Horovod framework"),
    ("import horovod.torch\nhorovod.torch.init()\n", "without 'as' cannot be switched"),
    ("from horovod import torch, run\n", "mixes frameworks with other names (run)"),
    ("import horovod.torch as hvd\ndef broken(:\n", "train.py does not parse"),
])
def test_a_script_that_cannot_be_switched_is_refused_naming_it(source, words):
    with pytest.raises(ValueError, match=r"train\.py") as error:
        switch_imports(source, "train.py")
    assert words in str(error.value)


@pytest.mark.parametrize("name, framework", [("pytorch", "torch"),
                                             ("tensorflow2", "tensorflow")])
def test_the_shipped_synthetic_benchmark_is_switched_on_its_import_line_only(name, framework):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}_synthetic_benchmark.py"
    source = path.read_text()
    out, changes = switch_imports(source, str(path))
    ours, theirs = f"import hvdx.{framework} as hvd", f"import horovod.{framework} as hvd"
    assert len(changes) == 1 and changes[0].endswith(f"{theirs} -> {ours}")
    assert out.replace(ours, theirs) == source


# --- strategies --------------------------------------------------------------------------

@pytest.mark.parametrize("name", SCRIPT_STRATEGIES)
def test_every_script_strategy_is_a_value_hvdx_environment_accepts(name):
    import hvdx.torch as hvd

    env = strategy_environment(name)
    compression = environment.parse("HVDX_COMPRESSION", env["HVDX_COMPRESSION"],
                                     hvd.Compression)
    sync = environment.parse("HVDX_SYNC", env["HVDX_SYNC"])
    if name == "horovod":
        assert compression is None and sync is None
        assert "HOROVOD_CYCLE_TIME" not in env
    elif name.startswith("topk") or name in ("fast", "safe"):
        assert compression.name == "topk" and sync is None
    else:
        assert compression is None and sync.name in ("dssync", "decentralized")


def test_the_tuned_topks_are_the_presets_with_horovods_defaults_as_the_baseline():
    assert strategy_environment("fast") == {
        "HVDX_COMPRESSION": "fast", "HVDX_SYNC": "none"}
    assert strategy_environment("safe")["HVDX_COMPRESSION"] == "safe"


@pytest.mark.parametrize("name, words", [
    ("stanza", "Stanza needs code"), ("stanza_f2", "Stanza needs code"),
    ("floor", "cannot be had from a script"), ("nope", "unknown")])
def test_a_strategy_that_needs_code_is_refused_for_a_script(name, words):
    with pytest.raises(ValueError, match=words):
        strategy_environment(name)


def test_named_strategies_that_need_code_are_errors_default_ones_are_skipped_with_a_note():
    with pytest.raises(ValueError, match="stanza cannot run a script"):
        script_strategies(["horovod", "stanza"], named=True)
    run, notes = script_strategies(["fast", "dssync", "stanza"], named=False)
    assert run == ["horovod", "fast", "dssync"]  # Horovod first, always
    assert len(notes) == 1 and notes[0].startswith("stanza skipped: Stanza needs code")


def test_horovods_synthetic_benchmark_lines_are_parsed():
    text = ("Model: resnet50\nIter #0: 12.5 img/sec per GPU\nIter #1: 130.0 img/sec per CPU\n"
            "Img/sec per GPU: 71.2 +-5.1\n")
    assert parse_throughput(text) == [12.5, 130.0]


# --- the step log ------------------------------------------------------------------------

def test_the_median_step_is_over_the_gaps_between_steps():
    assert step_log.intervals([1.0, 1.5, 2.5]) == [0.5, 1.0]
    assert step_log.median_step([0.0, 1.0, 3.0, 4.0]) == 1.0
    assert step_log.median_step([0.0, 1.0, 3.0]) == 1.5
    assert step_log.median_step([5.0]) is None


def test_unset_nothing_is_hooked(monkeypatch):
    import torch

    monkeypatch.delenv(step_log.VARIABLE, raising=False)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert step_log.watch_torch(optimizer, 0) is optimizer
    assert not optimizer._optimizer_step_post_hooks


def test_set_each_step_is_recorded_once_through_a_subclass_chain(monkeypatch, tmp_path):
    # Horovod's optimizer is a subclass whose step() calls its base class's: torch runs
    # the instance's hooks in both, and only the outer one may count.
    import torch

    prefix = str(tmp_path / "run.steps")
    monkeypatch.setenv(step_log.VARIABLE, prefix)
    monkeypatch.setattr(step_log, "_WATCHES", [])
    monkeypatch.setattr(step_log, "_RANK", [])
    monkeypatch.setattr(step_log, "atexit", types.SimpleNamespace(register=lambda *a: None))

    class Distributed(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = step_log.watch_torch(Distributed([weight], lr=0.1), rank=1)
    for _ in range(4):
        weight.grad = torch.ones(3)
        optimizer.step()
    step_log._write(prefix)
    logs = step_log.read(prefix)
    assert list(logs) == [1]
    first = step_log.main_optimizer(logs[1])
    assert len(first["times"]) == 4 and first["parameter_bytes"] == 12
    assert first["hvdx_stats"] is None  # a Horovod optimizer has no hvdx counters


def _fresh_step_log(monkeypatch, tmp_path):
    prefix = str(tmp_path / "run.steps")
    monkeypatch.setenv(step_log.VARIABLE, prefix)
    monkeypatch.setattr(step_log, "_WATCHES", [])
    monkeypatch.setattr(step_log, "_RANK", [])
    monkeypatch.setattr(step_log, "_TF_WATCHES", {})
    monkeypatch.setattr(step_log, "atexit", types.SimpleNamespace(register=lambda *a: None))
    return prefix


def test_tensorflow_unset_nothing_is_hooked(monkeypatch):
    tf = pytest.importorskip("tensorflow")

    monkeypatch.delenv(step_log.VARIABLE, raising=False)
    optimizer = tf.keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        pass
    assert step_log.watch_tensorflow(optimizer, 0) is optimizer
    assert step_log.watch_tensorflow(tape, 0, lambda *a: 1 / 0) is tape
    assert "apply_gradients" not in vars(optimizer) and "gradient" not in vars(tape)


def test_tensorflow_steps_are_recorded_once_each_eagerly_and_in_a_tf_function(
        monkeypatch, tmp_path):
    # In a tf.function the Python code runs when traced only: the time must be taken by
    # an op that runs on every call; a tape made every step records into one watch.
    tf = pytest.importorskip("tensorflow")
    prefix = _fresh_step_log(monkeypatch, tmp_path)
    weight = tf.Variable(tf.ones([3]))
    optimizer = tf.keras.optimizers.SGD(0.1)
    counters = []

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(weight * weight)
        tape = step_log.watch_tensorflow(
            tape, 1, lambda t, variables: counters.append(variables) or None)
        gradients = tape.gradient(loss, [weight])
        optimizer.apply_gradients(zip(gradients, [weight]))

    for _ in range(3):
        step()
    traced = tf.function(step)
    for _ in range(4):
        traced()
    assert traced.experimental_get_tracing_count() == 1
    assert len(counters) == 1 and len(counters[0]) == 1 and counters[0][0] is weight

    model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(4,))])
    keras_optimizer = step_log.watch_tensorflow(tf.keras.optimizers.SGD(0.1), lambda: 1)
    model.compile(optimizer=keras_optimizer, loss="mse")
    model.fit(tf.ones([12, 4]), tf.zeros([12, 2]), batch_size=4, epochs=2, verbose=0)
    keras_optimizer.apply_gradients([(tf.ones([4, 2]), model.trainable_variables[0]),
                                     (None, model.trainable_variables[1])])  # eagerly

    step_log._write(prefix)
    tape_log, keras_log = step_log.read(prefix)[1]["optimizers"]
    assert len(tape_log["times"]) == 7 and tape_log["parameter_bytes"] == 12
    assert tape_log["times"] == sorted(tape_log["times"])
    assert tape_log["hvdx_stats"] is None
    assert len(keras_log["times"]) == 2 * 3 + 1
    assert keras_log["parameter_bytes"] == (4 * 2 + 2) * 4  # the first step's variables
    assert float(weight[0]) == pytest.approx(0.8 ** 7)  # every step applied, once


# --- the row and the table ---------------------------------------------------------------

def _log(times, stats=None, nbytes=1000):
    return {"optimizers": [{"times": times, "parameter_bytes": nbytes, "hvdx_stats": stats}]}


def test_a_row_holds_the_median_step_wall_time_and_bytes_per_step():
    horovod = {"script": "train.py", "strategy": "horovod", "ranks": 4, "wall_s": 10.0,
               "img_per_s": [90.0, 100.0, 110.0],
               "step_logs": {"0": _log([0.0, 0.2, 0.4, 0.6]), "1": _log([0.0, 0.3])},
               "interface_tx_rx": [[4000, 8000], [4000, 4000]]}
    topk = dict(horovod, strategy="fast", wall_s=5.0, img_per_s=[],
                step_logs={"0": _log([0.0, 0.1, 0.2, 0.3],
                                     {"total_sent": 40.0, "total_received": 80.0})},
                interface_tx_rx=None)
    rows = [script_run.summarize(r, "net") for r in (horovod, topk)]
    script_run._add_speedups(rows)
    base, fast = rows
    assert base.steps == 4 and base.median_step_s == pytest.approx(0.2)
    assert base.img_per_s == 100.0
    assert base.hvdx_bytes_per_step == 1500.0  # 2 (n - 1) / n of the gradients
    assert base.interface_rx_per_step == 1500.0  # mean over hosts / steps
    assert base.bytes_agreement == 1.0
    assert fast.hvdx_bytes_per_step == 10.0 and fast.hvdx_received_per_step == 20.0
    assert fast.step_speedup == pytest.approx(2.0) and fast.wall_speedup == 2.0
    assert fast.img_per_s is None and fast.interface_rx_per_step is None
    table = script_run.render_table(rows)
    assert table.splitlines()[0] == "net"
    assert "fast" in table and "2.00" in table


def test_img_x_is_the_scripts_img_per_sec_over_horovods_where_both_printed_it():
    base = {"script": "b.py", "strategy": "horovod", "ranks": 4, "wall_s": 10.0,
            "img_per_s": [2.0, 3.0], "step_logs": {"0": _log([0.0, 1.0, 2.0])}}
    rows = [script_run.summarize(r, "net") for r in
            (base, dict(base, strategy="dssync", img_per_s=[5.0, 6.0, 7.0]),
             dict(base, strategy="safe", img_per_s=[]))]
    script_run._add_speedups(rows)
    assert [r.img_speedup for r in rows] == [1.0, pytest.approx(2.4), None]
    header, horovod, dssync, safe = script_run.render_table(rows).splitlines()[1:]
    assert header.index("step x") < header.index("img x") < header.index("wall x")
    assert dssync.split()[-2] == "2.40" and safe.split()[-2] == "-"
    assert horovod.split()[4] == "2.500" and dssync.split()[4] == "6.000"  # img/sec


# --- the command line --------------------------------------------------------------------

def test_script_flags_are_refused_before_anything_starts(tmp_path, capsys):
    train = tmp_path / "train.py"
    train.write_text("import horovod.torch as hvd\n")
    for argv, words in (
            (["--script", str(tmp_path / "none.py")], "none.py: no such file"),
            (["--script", str(train), "--steps", "5"], "--steps does not apply"),
            (["--script", str(train), "--strategies", "horovod,stanza"],
             "stanza cannot run a script")):
        assert main(argv + ["--localhost", "--out", str(tmp_path / "out")]) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class Started(Exception):
    pass


@pytest.mark.parametrize("script", [False, True])
def test_the_rows_old_names_topk_dgc_and_topk_masked_run_the_presets(tmp_path, monkeypatch,
                                                                     script):
    """--strategies topk_dgc,topk_masked, the rows' names before they took the presets',
    still run fast and safe."""
    from hvdx.bench import harness, script_run

    def started(spec, what, names, *args, **kwargs):
        raise Started(names)

    monkeypatch.setattr(harness, "run_bench", started)
    monkeypatch.setattr(script_run, "run_script_bench",
                        lambda spec, script, script_args, names, *a, **k: started(
                            spec, script, names))
    argv = ["--localhost", "--out", str(tmp_path / "out"), "--no-floor",
            "--strategies", "horovod,topk_dgc, topk_masked"]
    if script:
        train = tmp_path / "train.py"
        train.write_text("import horovod.torch as hvd\n")
        argv += ["--script", str(train)]
    with pytest.raises(Started) as info:
        main(argv)
    assert info.value.args[0] == ["horovod", "fast", "safe"]


# --- a variable's value as a strategy: the script's own compressor ------------------------

def test_items_split_at_commas_outside_parentheses_and_quotes():
    from hvdx.bench.script import split_items

    assert split_items("horovod, fast") == ["horovod", "fast"]
    assert split_items("horovod,HVDX_COMPRESSION=sign(0.5, scale=[1, 2]),safe") == \
        ["horovod", "HVDX_COMPRESSION=sign(0.5, scale=[1, 2])", "safe"]
    assert split_items("HVDX_SYNC=DSSync(topology='2,2')") == ["HVDX_SYNC=DSSync(topology='2,2')"]


def test_a_variables_value_is_a_strategy_that_sets_that_variable_alone():
    from hvdx.bench.script import variable_strategy

    assert variable_strategy("fast") is None
    assert variable_strategy("HVDX_COMPRESSION=scaled_sign(scale=0.5)") == \
        ("HVDX_COMPRESSION", "scaled_sign(scale=0.5)")
    assert strategy_environment("HVDX_COMPRESSION=scaled_sign(scale=0.5)") == {
        "HVDX_COMPRESSION": "scaled_sign(scale=0.5)", "HVDX_SYNC": "none"}
    assert strategy_environment("HVDX_SYNC=DSSync(intra_phases=3)") == {
        "HVDX_COMPRESSION": "none", "HVDX_SYNC": "DSSync(intra_phases=3)"}
    runs, notes = script_strategies(["horovod", "HVDX_COMPRESSION=mine(1)"], named=True)
    assert runs == ["horovod", "HVDX_COMPRESSION=mine(1)"] and notes == []


@pytest.mark.parametrize("item, match", [
    ("HVDX_COMPRESSION=", "give HVDX_COMPRESSION a value"),
    ("HVDX_COMPRESSION=mine(open('x'))", r"is not a Python literal"),
    ("HVDX_SYNC=1+", "HVDX_SYNC")])
def test_a_bad_value_is_refused_before_anything_runs_naming_it(item, match):
    from hvdx.bench.script import variable_strategy

    with pytest.raises(ValueError, match=match):
        variable_strategy(item)


def test_a_variables_value_is_refused_for_the_built_in_workloads(capsys):
    from hvdx.bench.cli import main

    assert main(["--localhost", "--strategies", "horovod,HVDX_COMPRESSION=mine(1)"]) == 2
    assert "runs with --script only" in capsys.readouterr().err
