"""Every catalogue entry, built-in or registered by a user (the fixture
``catalogue_entry``, tests/unit/conftest.py), as each view of the catalogue shows it: the
frameworks' names (API), the variables (environment), the framework registries, the
bench's table and its soak, ``hvdx plan``'s lines and options, the cost model, and the
recipe table's columns.

Each view shows what the entry's descriptor holds and nothing else: where a view does
not apply to an entry (a registered mixer has no bench row, a trainer no variable), the
descriptor's field is empty and the test checks that the view has nothing of it. The
texts the views print are pinned in tests/unit/test_strategy_views.py.
"""

import argparse
import importlib
import pathlib
import sys

import pytest

import hvdx
from hvdx import environment, plan
from hvdx.bench import soak
from hvdx.bench import strategies as bench
from hvdx.core.cost.layouts import default_entries
from hvdx.core.cost_model import STRATEGIES as COST_LAYOUTS
from hvdx.planning import flags as flags_module
from hvdx.planning import run_lines
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import KINDS, VARIABLES, load

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer, pytest.mark.stanza]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import recipes  # noqa: E402

#: Registry view -> the descriptor field it shows (each framework's registry).
REGISTRY_VIEWS = {
    "hvdx.torch.registry": {"ADAPTERS": "torch_adapter", "FITS": "torch_fit"},
    "hvdx.tensorflow.registry": {"TAPE_ADAPTERS": "tensorflow_tape",
                                 "KERAS_ADAPTERS": "tensorflow_keras",
                                 "TAPE_COUNTERS": "tensorflow_tape_counters",
                                 "TAPE_FITS": "tensorflow_tape_fit"}}


def test_its_kind_says_which_variable_chooses_it(catalogue_entry):
    assert catalogue_entry.kind in KINDS
    assert catalogue_entry.variable == VARIABLES.get(catalogue_entry.kind)
    if catalogue_entry.variable is None:  # a trainer: built in code, instead of the optimizer
        assert not catalogue_entry.constructors and catalogue_entry.torch_trainer


def test_its_variable_accepts_and_builds_its_constructors(catalogue_entry):
    """Each name its variable accepts is listed in the catalogue's order; each that builds
    (not a preset) gives a spec run by this entry's adapters."""
    names = [c.name for c in catalogue_entry.constructors]
    accepted = [] if catalogue_entry.variable is None else \
        environment.accepted_names(catalogue_entry.variable)
    assert [name for name in accepted if name in names] == names
    for constructor in catalogue_entry.constructors:
        if constructor.build is not None:
            spec = environment.parse(catalogue_entry.variable, f"{constructor.name}()")
            assert catalogue.descriptor(spec.name).torch_adapter == \
                catalogue_entry.torch_adapter


@pytest.mark.parametrize("module", sorted(REGISTRY_VIEWS))
def test_each_registry_holds_its_adapters(catalogue_entry, module):
    registry = pytest.importorskip(module)
    carried = catalogue_entry.variable is not None  # an entry point's compression= or sync=
    for view, field in REGISTRY_VIEWS[module].items():
        shown = carried and getattr(catalogue_entry, field) is not None
        assert (catalogue_entry.name in getattr(registry, view)) == shown, view
        if shown:
            assert getattr(registry, view)[catalogue_entry.name] is \
                load(getattr(catalogue_entry, field))


@pytest.mark.parametrize("framework", ["hvdx", "torch", "tensorflow"])
def test_the_frameworks_export_its_names(catalogue_entry, framework):
    if framework == "hvdx":
        module = hvdx
    else:
        pytest.importorskip(f"horovod.{framework}")
        module = importlib.import_module(f"hvdx.{framework}")
    for name, path in catalogue_entry.exports(framework):
        assert getattr(module, name) is load(path), name


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_script_calls_its_constructors_as_its_variable_does(catalogue_entry, framework):
    """In code, a compressor is ``hvd.Compression.<name>(...)``, a built-in
    synchronization strategy ``hvdx.<Name>(...)``, a registered mixer
    ``hvdx.mixer(name, ...)``: each builds what the variable's constructor builds."""
    pytest.importorskip(f"horovod.{framework}")
    hvd = importlib.import_module(f"hvdx.{framework}")
    for constructor in catalogue_entry.constructors:
        if constructor.build is None:
            continue  # a preset: a value of the variable, no name in code
        if catalogue_entry.kind == "compression":
            in_code = getattr(hvd.Compression, constructor.name)
        elif catalogue_entry.built_in:
            in_code = getattr(hvdx, constructor.name)
        else:
            def in_code():
                return hvdx.mixer(constructor.name)
        assert in_code().describe() == load(constructor.build)().describe()


def test_the_bench_has_its_rows(catalogue_entry):
    rows = bench._rows()
    assert [name for name, row in rows.items() if row.strategy == catalogue_entry.name] == \
        [variant.name for variant in catalogue_entry.bench]
    for variant in catalogue_entry.bench:
        assert rows[variant.name].default == variant.default
        assert all(bench.ALIASES[alias] == variant.name for alias in variant.aliases)


def test_the_soak_trains_it_if_its_entry_says_how(catalogue_entry):
    assert (catalogue_entry.name in soak._strategies()) == (catalogue_entry.soak is not None)


def _plan_args():
    parser = argparse.ArgumentParser(prog="hvdx plan")
    plan.add_arguments(parser)
    return parser, parser.parse_args(["--preset", "emulated"])


def test_the_cost_model_prices_it_and_the_plan_says_how_to_run_it(catalogue_entry):
    key = catalogue_entry.cost_model
    parser, args = _plan_args()
    flags = {o.flag for o in catalogue_entry.plan_options}
    assert flags <= set(parser._option_string_actions)
    if key is None:  # not priced: no layout, no row of hvdx plan, no options
        assert catalogue_entry.name not in COST_LAYOUTS
        assert catalogue_entry.plan_line is None and not flags
        return
    assert COST_LAYOUTS[key] is load(catalogue_entry.cost_layout)
    compared = [e for e in default_entries() if (e if isinstance(e, str) else e[0]) == key]
    assert compared == [(key, dict(o)) if o else key for o in catalogue_entry.cost_compared]
    given, cluster = flags_module.strategy_options(args), flags_module.build_cluster(args)
    for entry in compared:
        line = run_lines.run_line(entry, given, cluster)
        assert (line is not None) == (catalogue_entry.plan_line is not None)


def test_every_column_of_the_recipe_table_is_horovod_or_a_catalogue_entry():
    """docs/compatibility.md's columns (tests/recipes.py) name strategies by their
    catalogue entries; Horovod's own column is the baseline."""
    names = {entry.name for entry in catalogue.BUILT_IN}
    assert set(recipes.COLUMNS) - {"horovod"} <= names


def test_a_compression_entry_names_a_synchronizer_the_shared_drivers_can_run(
        catalogue_entry):
    """Every compression strategy, built-in or registered, runs on the shared drivers
    over its synchronizer: the entry names one that has every method and attribute of
    the protocol (hvdx.core.compression_protocol.SYNCHRONIZER_METHODS)."""
    from hvdx.core.compression_protocol import missing_from_synchronizer
    from hvdx.strategies.descriptor import COMPRESSION_DRIVERS

    if catalogue_entry.kind != "compression":
        assert catalogue_entry.synchronizer is None
        return
    assert catalogue_entry.synchronizer is not None
    assert missing_from_synchronizer(load(catalogue_entry.synchronizer)) == []
    for field, path in COMPRESSION_DRIVERS.items():
        assert getattr(catalogue_entry, field) == path, field


def test_the_shared_compression_drivers_name_no_strategy():
    """A new compression strategy needs no edit in the drivers: they import none (their
    docstrings may cite TopK as an example)."""
    import ast

    root = pathlib.Path(hvdx.__file__).parent
    for path in ["torch/compression_driver.py", "tensorflow/compression_driver.py",
                 "tensorflow/compression_residuals.py", "torch/dense_allreduce.py"]:
        imported = set()
        for node in ast.walk(ast.parse((root / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        assert not {m for m in imported if m.startswith("hvdx.strategies.")
                    and m not in ("hvdx.strategies.catalogue", "hvdx.strategies.descriptor")
                    or "user_compression" in m}, path
