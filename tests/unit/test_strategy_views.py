"""What users see of the strategies, pinned: the variables' messages, the bench's table
and its script values, the soak's strategies, the plan's ``to run`` lines and options,
and the frameworks' exports. These lists are views of the strategy catalogue
(:mod:`hvdx.strategies.catalogue`); the texts here are the ones they had when each was
written by hand, so that reading them from the catalogue changed no byte. That each
entry, built-in or registered, is in each view as its descriptor says is checked entry by
entry in tests/unit/test_strategy_entries.py."""

import argparse
import ast
import importlib
import pathlib
import types
from typing import Dict

import pytest

import hvdx
from hvdx import plan
from hvdx.bench import script, soak
from hvdx.bench import strategies as bench
from hvdx.core.cost_model import DEFAULT_STRATEGIES as PLAN_ENTRIES
from hvdx.environment_variables import ACCEPTED
from hvdx.planning import flags, run_lines
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load
from hvdx.strategies.topk.spec import topk

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer, pytest.mark.stanza,
              pytest.mark.int8, pytest.mark.sign]


def test_the_variables_accept_what_their_messages_say():
    assert ACCEPTED == {
        "HVDX_COMPRESSION": "none, fast, safe, topk, int8, sign, or a call of any of them "
                            "with literal arguments, e.g. \"topk(0.01, 0.01)\" or "
                            "\"topk(preset='safe', downlink_ratio=0.05)\" or "
                            "\"int8(chunk=256)\" or \"sign()\"",
        "HVDX_SYNC": "none, DSSync, Decentralized, or a call of either with literal "
                     "arguments, e.g. \"DSSync(intra_phases=4)\" or "
                     "\"Decentralized(graph='one-peer-exp')\""}


# (name, label, cost model, cost options, hvd.init's arguments, env, default, roles,
#  cost_options_of, period_of, final_stats, before_eval: given or not)
BENCH_TABLE = [
    ("horovod", "Horovod ring allreduce (baseline)", "horovod", {}, {}, {}, True, False,
     False, False, False, False),
    ("topk", "bidirectional TopK 0.01/0.01 with error feedback, sampled_threshold selector",
     "topk", {"downlink_ratio": 0.01, "mode": "sharded", "ratio": 0.01}, {}, {}, False,
     False, False, False, False, False),
    ("fast", "bidirectional TopK 0.01/0.01, global selection, DGC momentum correction "
     "with masking, small tensors averaged by hvdx (0.2 both ways under Adam's family)",
     "topk", {"downlink_ratio": 0.01, "mode": "sharded", "ratio": 0.01}, {}, {}, True,
     False, True, False, False, False),
    ("safe", "bidirectional TopK 0.01 up, 0.02 down, global selection, DGC momentum "
     "correction with masking, small tensors averaged by hvdx (0.2 both ways under "
     "Adam's family)", "topk",
     {"downlink_ratio": 0.02, "mode": "sharded", "ratio": 0.01}, {}, {}, True, False,
     True, False, False, False),
    ("dssync", "DS-Sync rotation, parameters from the cost of crossing", "dssync", {},
     {"process_sets": "dynamic"}, {}, True, False, True, True, False, False),
    ("dssync_adaptive", "DS-Sync rotation, re-planned from a bandwidth probe every 10 steps",
     "dssync", {}, {"process_sets": "dynamic"}, {}, False, False, True, True, False, False),
    ("decentralized", "decentralized SGD, one-peer exponential graph, adapt-then-combine",
     "decentralized", {"order": "adapt_then_combine", "graph": "one-peer-exp"}, {}, {},
     True, False, False, True, True, True),
    ("decentralized_static", "decentralized SGD, static exponential graph (log2 n peers), "
     "adapt-then-combine", "decentralized",
     {"order": "adapt_then_combine", "graph": "static-exp"}, {}, {}, False, False, False,
     True, True, True),
    ("decentralized_cta", "decentralized SGD, one-peer exponential graph, combine-then-adapt "
     "(exchange during forward and backward)", "decentralized",
     {"order": "combine_then_adapt", "graph": "one-peer-exp"}, {}, {}, False, False,
     False, True, True, True),
    ("stanza", "Stanza layer separation, 1 FC worker (the last rank)", "stanza",
     {"fc_workers": 1}, {}, {}, True, True, True, False, True, False),
    ("stanza_f2", "Stanza layer separation, 2 FC workers", "stanza", {"fc_workers": 2}, {},
     {}, False, True, True, False, True, False),
    ("stanza_auto", "Stanza layer separation, FC workers chosen by a probe "
     "(fc_workers='auto')", "stanza", {"fc_workers": 1}, {}, {}, False, True, True, False,
     True, False),
    ("stanza_micro", "Stanza layer separation, 1 FC worker, each batch in 4 micro-batches "
     "(the head on one while the features compute the next)", "stanza", {"fc_workers": 1},
     {}, {}, False, True, True, False, True, False),
    ("floor", "the floor: every rank trains alone, no communication at all (Horovod idle)",
     None, {}, {}, {}, False, False, False, False, False, False),
]


def test_the_bench_table_has_its_rows_in_order():
    got = [(n, s.label, s.cost_model, s.cost_options, s.init_kwargs, s.env, s.default,
            s.roles, s.cost_options_of is not None, s.period_of is not None,
            s.final_stats is not None, s.before_eval is not None)
           for n, s in bench.STRATEGIES.items()]
    assert got == BENCH_TABLE
    assert all(s.name == n for n, s in bench.STRATEGIES.items())
    assert bench.DEFAULT_STRATEGIES == ("horovod", "fast", "safe", "dssync",
                                        "decentralized", "stanza")
    assert bench.FULL_STRATEGIES == ("horovod", "topk", "fast", "safe", "dssync",
                                     "decentralized", "stanza")
    assert bench.ALIASES == {"topk_dgc": "fast", "topk_masked": "safe"}
    assert bench.strategy_names([" topk_dgc", "topk_masked ", "dssync", "nope"]) == \
        ["fast", "safe", "dssync", "nope"]


SCRIPT_VALUES = {
    "horovod": {},
    "topk": {"HVDX_COMPRESSION": "topk(ratio=0.01, topk_method='sampled_threshold', "
                                 "downlink_ratio=0.01)"},
    "fast": {"HVDX_COMPRESSION": "fast"},
    "safe": {"HVDX_COMPRESSION": "safe"},
    "dssync": {"HVDX_SYNC": "DSSync()"},
    "dssync_adaptive": {"HVDX_SYNC": "DSSync(probe_every=10, probe_bytes=1048576)"},
    "decentralized": {"HVDX_SYNC": "Decentralized(graph='one-peer-exp', "
                                   "order='adapt_then_combine')"},
    "decentralized_static": {"HVDX_SYNC": "Decentralized(graph='static-exp', "
                                          "order='adapt_then_combine')"},
    "decentralized_cta": {"HVDX_SYNC": "Decentralized(graph='one-peer-exp', "
                                       "order='combine_then_adapt')"},
}
STANZA_WHY = ("Stanza needs code (hvd.Stanza(features, head, ...) drives the training "
              "step): no variable switches a script to it")
FLOOR_WHY = ("the floor (every rank training alone) cannot be had from a script without "
             "changing it: its broadcasts and any metric allreduce still communicate")


def test_the_bench_runs_a_script_with_these_values():
    assert script.SCRIPT_STRATEGIES == tuple(SCRIPT_VALUES)
    assert script.NOT_FOR_SCRIPTS == {"stanza": STANZA_WHY, "floor": FLOOR_WHY}
    for name, values in SCRIPT_VALUES.items():
        env = dict({"HVDX_COMPRESSION": "none", "HVDX_SYNC": "none"}, **values)
        assert script.strategy_environment(name) == env
        assert list(script.strategy_environment(name)) == ["HVDX_COMPRESSION", "HVDX_SYNC"]
    for name, why in [("stanza", STANZA_WHY), ("stanza_f2", STANZA_WHY),
                      ("stanza_micro", STANZA_WHY), ("floor", FLOOR_WHY)]:
        with pytest.raises(ValueError) as info:
            script.strategy_environment(name)
        assert str(info.value) == f"--strategies {name} cannot run a script: {why}"
    with pytest.raises(ValueError) as info:
        script.strategy_environment("nope")
    assert str(info.value) == ("strategy='nope' is unknown; choose from horovod, topk, "
                               "fast, safe, dssync, dssync_adaptive, "
                               "decentralized, decentralized_static, decentralized_cta")
    run, notes = script.script_strategies(list(bench.DEFAULT_STRATEGIES) + ["floor"], False)
    assert run == ["horovod", "fast", "safe", "dssync", "decentralized"]
    assert notes == [f"stanza skipped: {STANZA_WHY}", f"floor skipped: {FLOOR_WHY}"]


def _spec(value):
    return (type(value), repr(value)) if not hasattr(value, "describe") else \
        (type(value), value.describe(), repr(vars(value)) if hasattr(value, "__dict__")
         else repr(value))


def test_the_soak_runs_these_strategies():
    hvd = types.SimpleNamespace(Compression=types.SimpleNamespace(topk=topk))
    assert soak.STRATEGIES == ("horovod", "topk", "dssync", "decentralized")
    expected = {"horovod": {}, "topk": {"compression": topk(0.01, 0.01)},
                "dssync": {"sync": hvdx.DSSync("shuffle", group_size=2, seed=0)},
                "decentralized": {"sync": hvdx.Decentralized("one-peer-exp")}}
    for name, options in expected.items():
        got = soak._options(name, hvd, hvdx)
        assert list(got) == list(options)
        assert [_spec(v) for v in got.values()] == [_spec(v) for v in options.values()]
    with pytest.raises(ValueError, match="strategy='nope' is unknown; choose from horovod, "
                       "topk, dssync, decentralized"):
        soak._options("nope", hvd, hvdx)


def _ok(strategy, consensus=1.0):
    return {"strategy": strategy, "steps": 10, "growth": 0.0, "rss_end_mb": 100.0,
            "max_diff": 0.5, "consensus": consensus, "consensus_path": [1.0, 1.0],
            "param_norm": 10.0, "median_step_s": 0.01, "accuracy": 0.9}


def test_the_soak_judges_drift_by_whether_the_ranks_keep_local_parameters():
    # max |x_i - x_0| = 0.5: fails a strategy that keeps the ranks identical, not one
    # that mixes (its consensus distance holds).
    lines = soak.render([_ok(n) for n in soak.STRATEGIES]).splitlines()
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:6]] == \
        ["FAILS", "FAILS", "ok", "ok"]


def _plan_args(*argv):
    parser = argparse.ArgumentParser(prog="hvdx plan")
    plan.add_arguments(parser)
    return parser, parser.parse_args(["--preset", "emulated", *argv])


PLAN_LINES = [
    "hvd.DistributedOptimizer(optimizer, ...), no hvdx argument (Horovod's own)", None,
    "compression=hvd.Compression.topk(0.01, mode='gathered')",
    "compression=hvd.Compression.topk(0.01, 0.01, mode='sharded'), or "
    "HVDX_COMPRESSION=fast (tuned, the same bytes)",
    "sync=hvdx.DSSync(intra_phases=1, cross_ranks=2)",
    "sync=hvdx.Decentralized(graph='static-exp')",
    "sync=hvdx.Decentralized(graph='one-peer-exp')",
    "sync=hvdx.Decentralized(graph='one-peer-exp', order='combine_then_adapt')",
    "hvd.Stanza(features, head, optimizer, fc_workers=1), in code only"]
PLAN_LINES_GIVEN = [
    "hvd.DistributedOptimizer(optimizer, ...), no hvdx argument (Horovod's own)", None,
    "compression=hvd.Compression.topk(0.02, 0.05, mode='gathered')",
    "compression=hvd.Compression.topk(0.02, 0.05, mode='sharded')",
    "sync=hvdx.DSSync(intra_phases=3, cross_ranks=1)",
    "sync=hvdx.Decentralized(graph='static-exp', mix_every=2)",
    "sync=hvdx.Decentralized(graph='one-peer-exp', mix_every=2)",
    "sync=hvdx.Decentralized(graph='one-peer-exp', order='combine_then_adapt', mix_every=2)",
    "hvd.Stanza(features, head, optimizer, fc_workers=2), in code only"]
PLAN_OPTIONS_HELP = """strategy options:
  --ratio RATIO         topk: uplink ratio
  --downlink-ratio DOWNLINK_RATIO
                        topk sharded: downlink ratio (default: --ratio)
  --intra-phases INTRA_PHASES
                        dssync: intra-rack phases per cross-rack phase
  --cross-ranks CROSS_RANKS
                        dssync: ranks per rack in a cross phase (default: all)
  --mix-every MIX_EVERY
                        decentralized: mix every N steps, local steps between
  --fc-workers FC_WORKERS
                        stanza: FC workers

"""


@pytest.mark.parametrize("argv, lines, options", [
    ((), PLAN_LINES, {"ratio": 0.01, "intra_phases": 1, "fc_workers": 1, "mix_every": 1}),
    (("--ratio", "0.02", "--mix-every", "2", "--cross-ranks", "1", "--intra-phases", "3",
      "--fc-workers", "2", "--downlink-ratio", "0.05"), PLAN_LINES_GIVEN,
     {"ratio": 0.02, "intra_phases": 3, "fc_workers": 2, "mix_every": 2,
      "downlink_ratio": 0.05, "cross_ranks": 1})])
def test_the_plan_tells_what_to_write_for_each_row(argv, lines, options):
    _, args = _plan_args(*argv)
    cluster, given = flags.build_cluster(args), flags.strategy_options(args)
    assert given == options
    assert [run_lines.run_line(entry, given, cluster) for entry in PLAN_ENTRIES] == lines


def test_the_plan_lists_the_strategies_options_in_this_order():
    # In catalogue order, each strategy's flags together. The one change from the
    # hand-written list: decentralized's --mix-every now comes before Stanza's
    # --fc-workers (the catalogue lists decentralized SGD first, as the bench's table
    # does); the flags, defaults and texts are the same.
    parser, _ = _plan_args()
    text = parser.format_help()
    assert text[text.index("strategy options:"):text.index("calibration (")] == \
        PLAN_OPTIONS_HELP


def test_the_frameworks_export_each_strategys_names():
    pytest.importorskip("horovod.torch")
    import hvdx.tensorflow as tf_hvd
    import hvdx.torch as torch_hvd
    from hvdx.strategies.dssync import mixer as tf_dssync
    from hvdx.tensorflow.mixing_state import STATE_GETTERS as tf_mixing
    from hvdx.strategies.stanza.tensorflow import trainer as tf_stanza
    from hvdx.tensorflow import compression_residuals as tf_compression
    from hvdx.tensorflow.compression_residuals import STATE_GETTERS as tf_compression_states
    from hvdx.strategies.dssync import mixer as dssync_optimizer
    from hvdx.strategies.stanza.torch import trainer as torch_stanza

    assert torch_hvd.dssync_process_sets is dssync_optimizer.dssync_process_sets
    assert torch_hvd.Stanza is torch_stanza.Stanza
    for name, module in [("topk_state", tf_compression_states),
                         ("CompressionState", tf_compression),
                         ("compression_state", tf_compression_states),
                         ("dssync_process_sets", tf_dssync), ("dssync_state", tf_mixing),
                         ("decentralized_state", tf_mixing),
                         ("Stanza", tf_stanza)]:
        assert getattr(tf_hvd, name) is getattr(module, name), name
    assert torch_hvd.DSSync is tf_hvd.DSSync is hvdx.DSSync
    assert torch_hvd.Decentralized is tf_hvd.Decentralized is hvdx.Decentralized


def _bindings(path: pathlib.Path) -> Dict[str, str]:
    """The names a module binds at its top level by ``from m import n`` or by
    ``n = _load("m:n")``, each with the lazy path ``"m:n"`` of what it binds."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}:{alias.name}"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", None) == "_load":
            for target in node.targets:
                found[target.id] = ast.literal_eval(node.value.args[0])
    return found


@pytest.mark.parametrize("framework, init", [
    ("hvdx", "__init__.py"), ("torch", "torch/__init__.py"),
    ("tensorflow", "tensorflow/__init__.py")])
def test_the_exported_names_are_the_catalogues_each_written_out(framework, init):
    """hvdx/__init__.py, hvdx/torch/__init__.py and hvdx/tensorflow/__init__.py write
    strategies' exports out one by one (found by grep and by IDEs), and serve the
    others by the module's ``__getattr__``: every name written out is bound there to
    the catalogue's path, no strategy's module gives a name that the catalogue does not
    list, and every name the catalogue exports is an attribute of the module."""
    exports = catalogue.exports(framework)
    assert exports == dict(e for entry in catalogue.BUILT_IN for e in entry.exports(framework))
    bound = _bindings(pathlib.Path(hvdx.__file__).parent / init)
    written = {name: path for name, path in bound.items() if name in exports}
    assert written == {name: exports[name] for name in written}
    from_strategies = {name for name, path in bound.items()
                       if path.startswith("hvdx.strategies.") and
                       not path.startswith("hvdx.strategies.descriptor:")}
    assert from_strategies <= set(exports)
    if framework == "hvdx":
        module = hvdx
    else:
        pytest.importorskip(f"horovod.{framework}")
        module = importlib.import_module(f"hvdx.{framework}")
    for name, path in exports.items():
        assert getattr(module, name) is load(path), name
        assert name in dir(module), name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_export'"):
        module.no_such_export


def test_hvdx_all_is_its_own_names_and_the_catalogues_exports():
    exports = {name for entry in catalogue.BUILT_IN for name, _ in entry.exports("hvdx")}
    assert set(hvdx.__all__) == {"Compressor", "Mixer", "__version__", "mixer",
                                 "register_compressor", "register_mixer"} | exports
    for name in hvdx.__all__:
        assert hasattr(hvdx, name), name
