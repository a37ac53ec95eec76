"""The catalogue of strategies is the one list: every built-in strategy appears once,
every lazy path names something, and the tables that used to be keyed by name (the
framework registries, the environment's names) are views of it, registered entries
included."""

import argparse
import importlib
import pathlib
import subprocess
import types
import sys

import pytest

from hvdx import environment
from hvdx.environment_variables import COMPRESSION_VARIABLE, SYNC_VARIABLE, asks_for_dssync
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import (KINDS, VARIABLES, Constructor, StrategyDescriptor,
                                        load)
from hvdx.strategies.topk.presets import PRESETS
from hvdx.strategies.topk.spec import topk
from hvdx.strategy_contract import Strategy

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer, pytest.mark.stanza,
              pytest.mark.int8, pytest.mark.sign]

BUILT_IN = {"topk", "int8", "sign", "user_compression", "dssync", "decentralized", "user_mixer",
            "stanza"}
FRAMEWORKS = ("torch", "tensorflow")

#: Registry view -> the descriptor field it shows.
TORCH_VIEWS = {"ADAPTERS": "torch_adapter", "FITS": "torch_fit"}
TENSORFLOW_VIEWS = {"TAPE_ADAPTERS": "tensorflow_tape", "KERAS_ADAPTERS": "tensorflow_keras",
                    "TAPE_COUNTERS": "tensorflow_tape_counters",
                    "TAPE_FITS": "tensorflow_tape_fit"}


def _framework_of(path: str):
    """The framework a lazy path's module belongs to, or ``None``."""
    top = path.split(":")[0].split(".")
    return top[1] if len(top) > 1 and top[1] in FRAMEWORKS else None


def _importable(framework: str) -> bool:
    try:
        importlib.import_module(f"hvdx.{framework}")
    except ImportError:
        return False
    return True


class _DummySpec(Strategy):
    name = "dummy_compression"
    argument = "compression"

    def __init__(self, level):
        self.level = level

    def fingerprint_settings(self, job, setup):
        return [("dummy.level", self.level)]


@pytest.fixture
def dummy():
    """A compression registered in the catalogue for one test, taken out afterwards."""

    def build(level=1):
        return _DummySpec(level)

    entry = StrategyDescriptor(
        name="dummy_compression", kind="compression", title="a dummy compression",
        constructors=(Constructor("dummy", build),),
        torch_adapter=catalogue.descriptor("user_compression").torch_adapter,
        built_in=False)
    catalogue.register(entry)
    try:
        yield entry
    finally:
        catalogue.unregister(entry.name)
    assert "dummy_compression" not in {d.name for d in catalogue.all_descriptors()}
    assert "dummy" not in environment.accepted_names(COMPRESSION_VARIABLE)


def test_every_built_in_strategy_appears_once():
    names = [d.name for d in catalogue.BUILT_IN]
    assert sorted(names) == sorted(BUILT_IN)
    assert len(names) == len(set(names))
    constructors = [c.name for d in catalogue.BUILT_IN for c in d.constructors]
    assert len(constructors) == len(set(constructors))
    assert all(d.kind in KINDS and d.built_in and d.title for d in catalogue.BUILT_IN)


def test_the_catalogue_imports_no_framework():
    code = ("import sys, hvdx.strategies.catalogue, hvdx.environment\n"
            "print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('torch', 'tensorflow', 'horovod', 'mpi4py', 'keras'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""


def test_every_lazy_path_resolves(catalogue_entry):
    """Of every entry, built-in or registered (the fixture, tests/unit/conftest.py)."""
    entry, name = catalogue_entry, catalogue_entry.name
    checked = 0
    for field, path in entry.lazy_paths():
        framework = _framework_of(path)
        if framework is not None and not _importable(framework):
            continue  # that framework is not installed here
        assert load(path) is not None, f"{name}.{field} = {path!r}"
        checked += 1
    assert checked or not entry.lazy_paths()


def test_a_lazy_path_that_names_nothing_is_an_error():
    with pytest.raises(AttributeError):
        load("hvdx.strategies.topk.spec:no_such_thing")
    with pytest.raises(ValueError, match="module:attribute"):
        load("hvdx.strategies.topk.spec.topk")


def test_the_cost_model_keys_are_layouts():
    from hvdx.core.cost_model import STRATEGIES

    priced = [d for d in catalogue.BUILT_IN if d.cost_model is not None]
    assert priced and {d.cost_model for d in priced} <= set(STRATEGIES)
    for d in priced:  # each layout in its strategy's folder, found through its entry
        assert STRATEGIES[d.cost_model] is load(d.cost_layout)
        assert d.cost_layout.startswith(f"hvdx.strategies.{d.name}.core_cost:")
    assert list(STRATEGIES)[:2] == ["horovod", "hierarchical"]  # Horovod's own
    with pytest.raises(ValueError, match="cost_layout="):
        StrategyDescriptor(name="x", kind="sync", title="x", cost_model="x")


def test_topks_presets_are_the_presets():
    entry = catalogue.descriptor("topk")
    assert [c.name for c in entry.constructors if c.preset] == list(PRESETS)


def _torch_registry():
    if not _importable("torch"):
        pytest.skip("PyTorch (or Horovod's torch) is not importable")
    return importlib.import_module("hvdx.torch.registry")


def _tensorflow_registry():
    if not _importable("tensorflow"):
        pytest.skip("TensorFlow (or Horovod's tensorflow) is not importable")
    return importlib.import_module("hvdx.tensorflow.registry")


def _expected(field: str):
    return {d.name for d in catalogue.all_descriptors()
            if d.kind in VARIABLES and getattr(d, field) is not None}


def test_the_torch_registry_is_the_catalogue():
    registry = _torch_registry()
    for view, field in TORCH_VIEWS.items():
        assert set(getattr(registry, view)) == _expected(field), view
    assert set(registry.ADAPTERS) == {d.name for k in VARIABLES for d in catalogue.of_kind(k)}


def test_the_tensorflow_registry_is_the_catalogue():
    registry = _tensorflow_registry()
    for view, field in TENSORFLOW_VIEWS.items():
        assert set(getattr(registry, view)) == _expected(field), view
    for view in ("TAPE_ADAPTERS", "KERAS_ADAPTERS"):
        assert set(getattr(registry, view)) == \
            {d.name for k in VARIABLES for d in catalogue.of_kind(k)}


@pytest.mark.parametrize("variable", [COMPRESSION_VARIABLE, SYNC_VARIABLE])
def test_the_environment_accepts_the_catalogues_names(variable):
    kind = catalogue.variable_kind(variable)
    names = [c.name for d in catalogue.of_kind(kind) for c in d.constructors]
    assert list(environment.accepted_names(variable)) == names
    assert VARIABLES[kind] == variable


def test_the_environment_builds_with_the_catalogues_constructors():
    assert environment.parse(SYNC_VARIABLE, "Decentralized").name == "decentralized"
    assert environment.parse(SYNC_VARIABLE, "DSSync('shuffle', group_size=2)").name == "dssync"
    assert environment.parse(COMPRESSION_VARIABLE, "safe").preset == "safe"


def test_dssync_is_the_strategy_that_asks_for_dynamic_process_sets():
    dynamic = [d for d in catalogue.all_descriptors() if d.dynamic_process_sets]
    assert [d.name for d in dynamic] == ["dssync"]
    for constructor in dynamic[0].constructors:
        assert asks_for_dssync(constructor.name)
        assert asks_for_dssync(f"{constructor.name}()")


def test_a_registered_descriptor_is_in_every_lookup(dummy):
    assert catalogue.descriptor("dummy_compression") is dummy
    assert dummy in catalogue.of_kind("compression")
    assert dummy not in catalogue.of_kind("compression", built_in_only=True)
    assert catalogue.environment_constructors(COMPRESSION_VARIABLE)["dummy"][1] is dummy
    assert "dummy" in environment.accepted_names(COMPRESSION_VARIABLE)
    assert "dummy" not in environment.accepted_names(SYNC_VARIABLE)
    spec = environment.parse(COMPRESSION_VARIABLE, "dummy(level=3)")
    assert isinstance(spec, _DummySpec) and spec.level == 3
    assert spec.environment == (COMPRESSION_VARIABLE, "dummy(level=3)")
    registry = _torch_registry()
    assert "dummy_compression" in registry.ADAPTERS
    assert registry.ADAPTERS["dummy_compression"] is registry.ADAPTERS["user_compression"]


def test_a_registered_compressor_is_a_catalogue_entry():
    from hvdx import compression_registry
    from hvdx.core.user_compression import Compressor

    class Sign(Compressor):
        def compress(self, x, step, name):
            return [x]

        def decompress(self, payloads, shape, dtype, step, name):
            return payloads[0]

        def settings(self):
            return {}

    saved = dict(compression_registry._REGISTRY)
    try:
        compression_registry.register_compressor("catalogue_sign", Sign)
        entry = catalogue.descriptor("catalogue_sign")
        assert entry.kind == "compression" and not entry.built_in
        shared = catalogue.descriptor("user_compression")
        assert entry.torch_adapter == shared.torch_adapter
        # TensorFlow's tapes log its bytes as PyTorch's optimizer does (hvdx_stats).
        assert entry.tensorflow_tape_counters == shared.tensorflow_tape_counters \
            == "hvdx.tensorflow.compression_driver:tape_counters"
        assert "catalogue_sign" in environment.accepted_names(COMPRESSION_VARIABLE)
    finally:
        compression_registry._REGISTRY.clear()
        compression_registry._REGISTRY.update(saved)
    with pytest.raises(KeyError):
        catalogue.descriptor("catalogue_sign")


def test_the_catalogue_refuses_a_name_twice(dummy):
    with pytest.raises(ValueError, match="already in the catalogue"):
        catalogue.register(StrategyDescriptor(name="topk", kind="compression", title="x",
                                              built_in=False))
    with pytest.raises(ValueError, match="already accepts"):
        catalogue.register(StrategyDescriptor(
            name="other", kind="compression", title="x",
            constructors=(Constructor("dummy", print),), built_in=False))
    with pytest.raises(ValueError, match="built in"):
        catalogue.unregister("dssync")
    catalogue.register(dummy)  # the same entry again: nothing happens


def test_a_malformed_descriptor_is_refused():
    with pytest.raises(ValueError, match="kind="):
        StrategyDescriptor(name="x", kind="optimizer", title="x")
    with pytest.raises(ValueError, match="chosen by no variable"):
        StrategyDescriptor(name="x", kind="trainer", title="x",
                           constructors=(Constructor("X", print),))
    with pytest.raises(ValueError, match="calls"):
        StrategyDescriptor(name="x", kind="sync", title="x",
                           constructors=(Constructor("p", preset="p", calls="X"),))
    with pytest.raises(ValueError, match="build="):
        Constructor("X")


def test_a_wrong_sync_names_the_catalogues_synchronization_strategies():
    from hvdx.strategy_contract import strategy_of

    with pytest.raises(TypeError) as raised:
        strategy_of(None, "DSSync")
    for entry in catalogue.of_kind("sync"):
        for constructor in entry.constructors:
            assert f"sync=hvdx.{constructor.name}(...)" in str(raised.value)


#: What a fifth built-in strategy (a synchronization strategy, priced by the cost model)
#: edits outside its own folder: its line in the catalogue. Every list that named the
#: strategies is a view of the catalogue (the variables' message, the bench's table, its
#: script values and soak, the plan's lines and options, the registries, the cost
#: model's layouts and the rows it compares by default, TensorFlow's preset handling,
#: the compatibility table's columns), and each strategy's functions for them live in
#: its folder (``bench_rows.py``, ``plan_line.py``, ``core_cost.py``, its torch fit).
#: Its exported names (``hvdx.DSSync``, ``hvd.dssync_process_sets``) are served by the
#: modules' ``__getattr__``; writing them out in hvdx/__init__.py and the frameworks'
#: modules, so that grep and IDEs find them, is optional (a test checks that those
#: written out are the catalogue's: tests/unit/test_strategy_views.py). A compressor's
#: constructor is ``Compression.<name>`` in both frameworks through the catalogue too; a
#: name of its own in Keras' module would edit hvdx/tensorflow/keras/__init__.py.
#: Before, the lists below were written by hand too.
FIFTH_STRATEGY_EDITS = ("hvdx/strategies/catalogue.py",)
NO_LONGER_EDITED = ("hvdx/environment_variables.py", "hvdx/bench/strategies.py",
                    "hvdx/bench/script.py", "hvdx/bench/soak.py", "hvdx/planning/flags.py",
                    "hvdx/planning/run_lines.py", "hvdx/core/cost/layouts/__init__.py",
                    "hvdx/core/cost/predict.py", "hvdx/torch/registry.py",
                    "hvdx/tensorflow/compression.py", "tests/recipes.py", "hvdx/__init__.py",
                    "hvdx/torch/__init__.py", "hvdx/tensorflow/__init__.py")


def test_the_files_a_fifth_strategy_edits_are_there():
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in FIFTH_STRATEGY_EDITS + NO_LONGER_EDITED:
        assert (root / path).is_file(), path
    assert FIFTH_STRATEGY_EDITS[0] == "hvdx/strategies/catalogue.py" and \
        not set(FIFTH_STRATEGY_EDITS) & set(NO_LONGER_EDITED)


def test_a_fifth_built_in_strategy_is_one_catalogue_entry(monkeypatch):
    """Every view of the catalogue shows a strategy that is its folder (a module of
    the tests, fifth_strategy.py) and one catalogue entry: the exports, the variables,
    the bench's rows, the soak, the plan's lines and options, the cost model, and the
    compatibility table's columns."""
    import fifth_strategy
    from hvdx import environment_variables, plan
    from hvdx.planning import flags, run_lines
    from hvdx.core.cost import layouts
    from hvdx.core.cost_model import STRATEGIES, compare, predict
    from hvdx.bench import script, soak
    from hvdx.bench import strategies as bench

    fifth = fifth_strategy.FIFTH
    monkeypatch.setattr(catalogue, "BUILT_IN", catalogue.BUILT_IN + (fifth,))

    # The API: each framework's module serves the names it does not write out.
    import hvdx

    assert hvdx.Fifth is fifth_strategy.Fifth and "Fifth" in dir(hvdx)
    assert fifth.exports("hvdx") == (("Fifth", "fifth_strategy:Fifth"),)
    for framework in filter(_importable, FRAMEWORKS):
        module = importlib.import_module(f"hvdx.{framework}")
        assert module.Fifth is fifth_strategy.Fifth, framework
        assert module.fifth_matrix is fifth_strategy.fifth_matrix, framework
        assert {"Fifth", "fifth_matrix"} <= set(dir(module)), framework

    assert environment_variables._accepted(SYNC_VARIABLE) == (
        "none, DSSync, Decentralized, Fifth, or a call of any of them with literal "
        "arguments, e.g. \"DSSync(intra_phases=4)\" or "
        "\"Decentralized(graph='one-peer-exp')\" or \"Fifth(level=2)\"")
    assert environment.parse(SYNC_VARIABLE, "Fifth(level=3)").describe() == \
        "fifth level=3"

    rows = bench._rows()
    assert list(rows)[-3:] == ["fifth", "fifth_high", "floor"]
    assert rows["fifth"].default and not rows["fifth_high"].default
    assert rows["fifth_high"].label == "fifth, level 9" and rows["fifth"].strategy == "fifth"
    assert rows["fifth_high"].aliases == ("high",)
    monkeypatch.setattr(bench, "STRATEGIES", rows)
    assert script._environment_values()["fifth_high"] == {SYNC_VARIABLE: "Fifth(level=9)"}

    assert soak._strategies()[-1] == "fifth"
    built = soak._options("fifth", types.SimpleNamespace(), None)["sync"]
    assert isinstance(built, fifth_strategy.Fifth) and built.describe() == "fifth level=2"

    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    args = parser.parse_args(["--fifth-level", "3"])
    assert flags.strategy_options(args)["fifth_level"] == 3
    assert run_lines.run_line("fifth", flags.strategy_options(args),
                              flags.build_cluster(args)) == "sync=hvdx.Fifth(level=3)"

    # The cost model prices it by its entry's layout, and compares its entries by
    # default after the others'.
    assert list(STRATEGIES)[-1] == "fifth"
    assert STRATEGIES["fifth"] is fifth_strategy.fifth_layout
    assert layouts.default_entries()[-2:] == ("fifth", ("fifth", {"fifth_level": 2}))
    cluster, workload = flags.build_cluster(args), flags.build_workload(args)
    assert predict("fifth", cluster, workload, fifth_level=3).compute_s == \
        pytest.approx(3 * workload.compute_s)
    priced = compare(cluster, workload, ["fifth", "horovod"], **flags.strategy_options(args))
    assert {p.label for p in priced} == {"fifth level 3", "horovod"}
    with pytest.raises(ValueError, match="takes no option ratio"):
        predict("fifth", cluster, workload, ratio=0.1)

    # The compatibility table: a column of its own, untested in every row.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    try:
        import recipes
    finally:
        sys.path.pop(0)
    assert list(recipes.columns().items())[-1] == ("fifth", "Fifth")
    table = recipes.render().splitlines()
    headers = [line for line in table if line.startswith("| recipe |")]
    assert headers and all(line.endswith("| Fifth |") for line in headers)
    rows_of_recipes = [line for line in table if line.startswith("| ")
                       and not line.startswith("| recipe |")]
    assert len(rows_of_recipes) == len(recipes.RECIPES)
    assert all(line.endswith("| untested |") for line in rows_of_recipes)


def test_a_fifth_built_in_compressor_is_an_attribute_of_both_frameworks_compression(
        monkeypatch):
    """hvdx.torch.Compression and hvdx.tensorflow.Compression (metaclass Registered)
    find a built-in compressor's constructor in the catalogue; a preset is no
    attribute (it is a value of HVDX_COMPRESSION)."""
    from hvdx.compression_registry import Registered
    from hvdx.strategies.topk.spec import topk

    fifth = StrategyDescriptor(
        name="fifthk", kind="compression", title="FifthK",
        constructors=(Constructor("fifthk", "hvdx.strategies.topk.spec:topk"),
                      Constructor("quick", preset="quick", calls="fifthk")))
    monkeypatch.setattr(catalogue, "BUILT_IN", catalogue.BUILT_IN + (fifth,))

    class Compression(metaclass=Registered):
        """As the frameworks' (their own attributes, topk, come first)."""

    assert Compression.fifthk is topk
    with pytest.raises(AttributeError, match="register_compressor"):
        Compression.quick


@pytest.mark.parametrize("shared, torch_adapter, exported", [
    ("user_compression", "hvdx.torch.compression_driver:adapter", "compression_state"),
    ("user_mixer", "hvdx.torch.mixing_optimizer:adapter", "mixer_state")])
def test_a_registered_class_runs_with_its_built_in_entrys_adapters(shared, torch_adapter,
                                                                    exported):
    """Registered compressors and mixers are entries named by their users; the one
    built-in entry they share holds the adapters and what hvdx.tensorflow exports."""
    entry = catalogue.registered_entry(shared, "my_own", "my own", lambda: None)
    assert entry.name == "my_own" and not entry.built_in
    assert [c.name for c in entry.constructors] == ["my_own"]
    assert entry.torch_adapter == torch_adapter
    assert exported in dict(catalogue.descriptor(shared).exports("tensorflow"))
