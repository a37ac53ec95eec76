"""The strategy contract: what every hvdx strategy promises, checked for each of them.

Every strategy an entry point carries (each catalogue entry whose kind has a variable,
built-in or registered by a user: the fixture ``catalogue_entry``, tests/unit/conftest.py)
resolves against a job into rank-independent fingerprint settings, turns a bad argument
into a fingerprint entry instead of raising early, and has an adapter in every framework
registry.
"""

import ast
import pathlib
import types

import numpy as np
import pytest

import hvdx
from hvdx import environment
from hvdx.strategies.topk.spec import topk
from hvdx.compression_registry import UserCompression
from hvdx.core.user_compression import Compressor
from hvdx.core.topology import Topology
from hvdx.mixer_registry import UserMixing
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load
from hvdx.strategy_contract import Job, MixingStrategy, Strategy, global_due, resolve, strategy_of
from strategy_entries import EntryHalf, entry_ids

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer, pytest.mark.stanza]

ROOT = pathlib.Path(hvdx.__file__).parent
ENTRY_POINTS = ["torch/optimizer.py", "tensorflow/gradient_tape.py",
                "tensorflow/keras/optimizer.py"]


class _None:
    pass


class _Sign(Compressor):
    """A registered compressor (hvdx.register_compressor) needs no registration here."""

    def __init__(self, scale):
        self.scale = scale

    def settings(self):
        return {"scale": self.scale}


class _ProcessSet:
    def __init__(self, ranks):
        self.ranks = ranks


def job(size=4, rank=0, compression=_None, process_set=None):
    everyone = _ProcessSet(list(range(size)))
    horovod = types.SimpleNamespace(global_process_set=everyone)
    return Job(size=size, rank=rank, horovod=horovod, compression=compression,
               no_compression=_None,
               process_set=everyone if process_set is None else process_set,
               framework="test")


#: Built-in entries whose spec a fake job cannot build from its example (DS-Sync's
#: rotation would detect the topology over MPI), and the shared entries of registered
#: classes, which have no example of their own.
OVERRIDES = {
    "dssync": lambda: hvdx.DSSync("rotation", topology=Topology.from_counts(2, 2)),
    "user_compression": lambda: UserCompression("contract_sign", _Sign, (0.5,)),
    "user_mixer": lambda: UserMixing("user_mixer", EntryHalf),
}


def strategies():
    """One instance of each built-in strategy an entry point carries, keyed by its
    catalogue entry: its first example, built as its variable builds it
    (``HVDX_SYNC="Decentralized(graph='one-peer-exp')"``), or its override above. A
    new built-in strategy needs no line here."""
    built = {}
    for entry in catalogue.BUILT_IN:
        if entry.variable is None:
            continue
        if entry.name in OVERRIDES:
            built[entry.name] = OVERRIDES[entry.name]()
        else:
            built[entry.name] = environment.parse(entry.variable, entry.examples[0])
    return built


def spec_of(entry):
    """The spec of ``entry``: its instance above if it is built in, else what its
    constructor builds with no arguments (the registered class's defaults)."""
    if entry.built_in:
        return strategies()[entry.name]
    return load(entry.constructors[0].build)()


#: The entries an entry point carries: each whose kind has a variable (a trainer, Stanza,
#: replaces the optimizer and has no spec).
CARRIED = entry_ids(lambda entry: entry.variable is not None)


def test_every_built_in_strategy_an_entry_point_carries_has_an_instance_here():
    assert set(strategies()) == {entry.name for entry in catalogue.BUILT_IN
                                 if entry.variable is not None}


@pytest.mark.parametrize("catalogue_entry", CARRIED, indirect=True)
def test_every_strategy_implements_the_contract(catalogue_entry):
    strategy = spec_of(catalogue_entry)
    assert isinstance(strategy, Strategy)
    # Its name is the registry key of the adapters that run it: its entry's own, or,
    # for a registered compressor, the entry they all share.
    assert strategy.name == catalogue_entry.name or not catalogue_entry.built_in
    assert catalogue.descriptor(strategy.name).torch_adapter == catalogue_entry.torch_adapter
    assert strategy.argument == catalogue_entry.kind
    resolved = resolve(strategy, job())
    assert resolved.error is None
    # Settings render the same on every rank: no addresses, no rank-dependent values.
    rendered = [repr(v) for _, v in resolved.settings]
    assert not any("0x" in r for r in rendered)
    assert resolve(strategy, job(rank=3)).settings == resolved.settings


@pytest.mark.parametrize("catalogue_entry", CARRIED, indirect=True)
def test_every_strategy_has_an_adapter_in_every_framework(catalogue_entry):
    torch_registry = pytest.importorskip("hvdx.torch.registry")
    tf_registry = pytest.importorskip("hvdx.tensorflow.registry")
    name = spec_of(catalogue_entry).name
    assert name in torch_registry.ADAPTERS
    assert name in tf_registry.TAPE_ADAPTERS
    assert name in tf_registry.KERAS_ADAPTERS


class _Unregistered(Strategy):
    name = "unregistered"

    def fingerprint_settings(self, job, setup):
        return []


def test_a_strategy_without_an_adapter_is_refused_by_name():
    """Refused with an error that names it, never silently run as Horovod."""
    tf_registry = pytest.importorskip("hvdx.tensorflow.registry")
    with pytest.raises(TypeError, match="strategy 'unregistered'"):
        tf_registry.tape(lambda: None, _Unregistered(), None, None)


def test_the_entry_points_name_no_strategy():
    """The entry points look strategies up; none imports or tests a concrete one."""
    concrete = {"DSSync", "Decentralized", "TopKCompression"}
    for path in ENTRY_POINTS:
        tree = ast.parse((ROOT / path).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        assert not names & concrete, f"{path} names {sorted(names & concrete)}"


#: The synchronization strategies, built in or registered.
SYNC = entry_ids(lambda entry: entry.kind == "sync")


@pytest.mark.parametrize("catalogue_entry", SYNC, indirect=True)
def test_mixing_strategies_refuse_compression_through_the_fingerprint(catalogue_entry):
    strategy = spec_of(catalogue_entry)
    name = strategy.name
    assert isinstance(strategy, MixingStrategy)
    resolved = resolve(strategy, job(compression=topk(0.01)))
    assert isinstance(resolved.error, ValueError)
    assert "compression=" in str(resolved.error)
    # The error is a setting, so a rank that failed alone makes every rank fail alike.
    assert resolved.settings == [(f"{name}.error", str(resolved.error))]
    with pytest.raises(ValueError, match="compression"):
        resolved.raise_error()


@pytest.mark.parametrize("catalogue_entry", SYNC, indirect=True)
def test_mixing_strategies_refuse_another_process_set(catalogue_entry):
    resolved = resolve(spec_of(catalogue_entry), job(process_set=_ProcessSet([0, 1])))
    assert "process_set" in str(resolved.error)


#: Horovod's reduction ops, as horovod.torch and horovod.tensorflow number them.
OPS = {"Average": 0, "Sum": 1, "Adasum": 2, "Min": 3, "Max": 4, "Product": 5}


def gradient_job(framework, **arguments):
    """A job with the gradient arguments an entry point hands its strategy."""
    everyone = _ProcessSet([0, 1])
    horovod = types.SimpleNamespace(global_process_set=everyone, **OPS)
    return Job(size=2, rank=0, horovod=horovod, compression=_None, no_compression=_None,
               process_set=everyone, framework=framework, **arguments)


#: The compression strategies, built in or registered.
COMPRESSION = entry_ids(lambda entry: entry.kind == "compression")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
@pytest.mark.parametrize("catalogue_entry", COMPRESSION, indirect=True)
@pytest.mark.parametrize("arguments, message", [
    ({"op": OPS["Adasum"]}, "op=Adasum is not supported with "),
    ({"op": OPS["Min"]}, "op=Min is not supported with "),
    ({"op": OPS["Product"]}, "use op=hvd.Average or op=hvd.Sum"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be > 0"),
])
def test_compression_strategies_refuse_what_they_cannot_honour_alike_in_both_frameworks(
        framework, catalogue_entry, arguments, message):
    """A strategy's job checks are its spec's: one message for torch and TensorFlow,
    and a fingerprint entry, so a rank that failed alone makes every rank fail."""
    strategy = spec_of(catalogue_entry)
    resolved = resolve(strategy, gradient_job(framework, **arguments))
    assert isinstance(resolved.error, ValueError)
    assert message in str(resolved.error)
    assert resolved.settings == [(f"{strategy.name}.error", str(resolved.error))]
    other = "tensorflow" if framework == "torch" else "torch"
    assert str(resolve(strategy, gradient_job(other, **arguments)).error) == \
        str(resolved.error)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
@pytest.mark.parametrize("catalogue_entry", COMPRESSION, indirect=True)
@pytest.mark.parametrize("op", [None, OPS["Average"], OPS["Sum"]])
def test_compression_strategies_average_or_sum(framework, catalogue_entry, op):
    assert resolve(spec_of(catalogue_entry), gradient_job(framework, op=op)).error is None


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_topk_predivides_with_average_only_and_a_registered_compressor_never(framework):
    def error(name, **arguments):
        return resolve(strategies()[name], gradient_job(framework, **arguments)).error

    assert error("topk", op=OPS["Average"], gradient_predivide_factor=2.0) is None
    assert "gradient_predivide_factor not supported with op != Average" in \
        str(error("topk", op=OPS["Sum"], gradient_predivide_factor=2.0))
    for op in (OPS["Average"], OPS["Sum"]):
        assert "gradient_predivide_factor=2.0 is not supported with a registered " \
               "compressor; leave it 1.0" in \
               str(error("user_compression", op=op, gradient_predivide_factor=2.0))


def test_momentum_correction_is_refused_outside_torch_by_the_spec():
    spec = topk(0.01, momentum_correction=True)
    assert resolve(spec, gradient_job("torch")).error is None
    assert "momentum_correction=True is implemented for PyTorch's SGD only" in \
        str(resolve(spec, gradient_job("tensorflow")).error)


def test_no_adapter_checks_the_reduction_itself():
    """The job checks live in the specs (Strategy.prepare); an adapter that tested
    ``op`` again would be a second copy to keep in step."""
    adapters = sorted(ROOT.glob("strategies/*/torch/*.py")) + \
        sorted(ROOT.glob("strategies/*/tensorflow/*.py")) + \
        [ROOT / "torch/compression_driver.py", ROOT / "tensorflow/compression_driver.py"]
    for path in adapters:
        text = path.read_text()
        assert "Adasum" not in text and "is not supported with" not in text, path


def test_a_matrix_of_another_size_is_an_error_of_the_job_not_of_the_constructor():
    w = np.full((3, 3), 1 / 3)
    strategy = hvdx.Decentralized(w)  # fine without a job
    resolved = resolve(strategy, job(size=4))
    assert isinstance(resolved.error, ValueError) and "graph" in str(resolved.error)
    assert resolve(strategy, job(size=3)).error is None


def test_sync_wins_and_anything_else_is_a_type_error():
    t, d = topk(0.01), hvdx.Decentralized()
    assert strategy_of(t, None) is t
    assert strategy_of(_None, d) is d
    assert strategy_of(t, d) is d  # and d then refuses t (above)
    assert strategy_of(_None, None) is None
    with pytest.raises(TypeError, match="sync='ring'"):
        strategy_of(_None, "ring")
    with pytest.raises(TypeError, match="sync="):
        strategy_of(_None, t)  # a compression is not a sync strategy


def test_global_due_counts_steps_from_one():
    assert [s for s in range(9) if global_due(s, 3)] == [2, 5, 8]
    assert not any(global_due(s, 0) for s in range(9))


def test_mixing_options_are_validated_once_for_every_mixing_strategy():
    for make in (lambda **kw: hvdx.DSSync("shuffle", group_size=1, **kw),
                 lambda **kw: hvdx.Decentralized(**kw)):
        with pytest.raises(ValueError, match="global_every=-1"):
            make(global_every=-1)
        with pytest.raises(ValueError, match="swa_every=2"):
            make(swa_every=2)
        with pytest.raises(ValueError, match="average_optimizer_state='yes'"):
            make(average_optimizer_state="yes")
