"""The strategy contract: what every hvdx strategy promises, checked for each of them.

Every registered strategy resolves against a job into rank-independent fingerprint
settings, turns a bad argument into a fingerprint entry instead of raising early, and
has an adapter in every framework registry.
"""

import ast
import pathlib
import types

import numpy as np
import pytest

import hvdx
from hvdx.strategies.topk.spec import topk
from hvdx.compression_registry import UserCompression
from hvdx.core.user_compression import Compressor
from hvdx.core.topology import Topology
from hvdx.strategy import Job, MixingStrategy, Strategy, global_due, resolve, strategy_of

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


def strategies():
    """One instance of every strategy this release provides (no detection needed)."""
    return {
        "topk": topk(0.01, 0.01),
        "dssync": hvdx.DSSync("rotation", topology=Topology.from_counts(2, 2)),
        "decentralized": hvdx.Decentralized("one-peer-exp"),
        "user_compression": UserCompression("contract_sign", _Sign, (0.5,)),
    }


@pytest.mark.parametrize("name", sorted(strategies()))
def test_every_strategy_implements_the_contract(name):
    strategy = strategies()[name]
    assert isinstance(strategy, Strategy)
    assert strategy.name == name
    assert strategy.argument in ("compression", "sync")
    resolved = resolve(strategy, job())
    assert resolved.error is None
    # Settings render the same on every rank: no addresses, no rank-dependent values.
    rendered = [repr(v) for _, v in resolved.settings]
    assert not any("0x" in r for r in rendered)
    assert resolve(strategy, job(rank=3)).settings == resolved.settings


@pytest.mark.parametrize("name", sorted(strategies()))
def test_every_strategy_has_an_adapter_in_every_framework(name):
    torch_registry = pytest.importorskip("hvdx.torch.registry")
    tf_registry = pytest.importorskip("hvdx.tensorflow.registry")
    assert name in torch_registry.ADAPTERS
    assert name in tf_registry.TAPE_ADAPTERS
    assert name in tf_registry.KERAS_ADAPTERS


class _Unregistered(Strategy):
    name = "unregistered"

    def fingerprint_settings(self, job, plan):
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


@pytest.mark.parametrize("name", ["dssync", "decentralized"])
def test_mixing_strategies_refuse_compression_through_the_fingerprint(name):
    strategy = strategies()[name]
    assert isinstance(strategy, MixingStrategy)
    resolved = resolve(strategy, job(compression=topk(0.01)))
    assert isinstance(resolved.error, ValueError)
    assert "compression=" in str(resolved.error)
    # The error is a setting, so a rank that failed alone makes every rank fail alike.
    assert resolved.settings == [(f"{name}.error", str(resolved.error))]
    with pytest.raises(ValueError, match="compression"):
        resolved.raise_error()


@pytest.mark.parametrize("name", ["dssync", "decentralized"])
def test_mixing_strategies_refuse_another_process_set(name):
    resolved = resolve(strategies()[name], job(process_set=_ProcessSet([0, 1])))
    assert "process_set" in str(resolved.error)


def test_a_matrix_of_another_size_is_an_error_of_the_job_not_of_the_constructor():
    w = np.full((3, 3), 1 / 3)
    strategy = hvdx.Decentralized(w)  # fine without a job
    resolved = resolve(strategy, job(size=4))
    assert isinstance(resolved.error, ValueError) and "topology" in str(resolved.error)
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
