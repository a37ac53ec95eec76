"""``HVDX_COMPRESSION`` / ``HVDX_SYNC``: parsed without eval, built by the constructors
the code would call, the code's arguments first; and what ``hvd.init`` does with them.

The MPI tests (tests/mpi/*/test_*environment*.py) train with them at 1, 2 and 4 ranks.
"""

import pytest

import hvdx
from hvdx import environment, environment_variables
from hvdx.environment_variables import VariableError
from hvdx.mpi.init_environment import init_arguments, launch_difference
from hvdx.strategies.topk.spec import topk

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer]

NONE = object()  # a framework's Compression.none


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in ("HVDX_COMPRESSION", "HVDX_SYNC"):
        monkeypatch.delenv(name, raising=False)
    environment.forget()
    yield
    environment.forget()


def compression(raw):
    return environment.parse("HVDX_COMPRESSION", raw)


def sync(raw):
    return environment.parse("HVDX_SYNC", raw)


@pytest.mark.parametrize("raw, in_code", [
    ("topk(0.01, 0.01)", lambda: topk(0.01, 0.01)),
    ("topk(ratio=0.05, mode='sharded', min_size=0)",
     lambda: topk(0.05, mode="sharded", min_size=0)),
    ("topk", lambda: topk()),
    ("fast", lambda: topk(preset="fast")),
    (" safe ", lambda: topk(preset="safe")),
    ("topk(preset='safe', downlink_ratio=0.05)",
     lambda: topk(preset="safe", downlink_ratio=0.05)),
    # The old spelling of topk_method and small_tensors, and the new one.
    ("topk(0.01, selector='threshold', small_tensors='hvdx')",
     lambda: topk(0.01, topk_method="sampled_threshold", small_tensors="in_topk_step")),
    ("topk(0.01, topk_method='sampled_threshold', small_tensors='in_topk_step')",
     lambda: topk(0.01, selector="threshold", small_tensors="hvdx")),
    ("topk(preset='fast', selector='exact')", lambda: topk(preset="fast", topk_method="exact")),
])
def test_a_compression_is_the_spec_the_same_call_builds_in_code(raw, in_code):
    spec = compression(raw)
    assert spec == in_code()
    assert spec.environment == ("HVDX_COMPRESSION", raw)  # compared across ranks


@pytest.mark.parametrize("raw, in_code", [
    ("DSSync", lambda: hvdx.DSSync()),
    ("DSSync('shuffle', group_size=2, seed=3)",
     lambda: hvdx.DSSync("shuffle", group_size=2, seed=3)),
    ("DSSync(schedule=[[[0, 1], [2, 3]], [[0, 2], [1, 3]]])",
     lambda: hvdx.DSSync([[[0, 1], [2, 3]], [[0, 2], [1, 3]]])),
    ("Decentralized(graph='one-peer-exp')", lambda: hvdx.Decentralized("one-peer-exp")),
    ("Decentralized([[0.5, 0.5], [0.5, 0.5]], mix_every=2)",
     lambda: hvdx.Decentralized([[0.5, 0.5], [0.5, 0.5]], mix_every=2)),
])
def test_a_sync_is_the_spec_the_same_call_builds_in_code(raw, in_code):
    spec = sync(raw)
    assert type(spec) is type(in_code()) and repr(spec) == repr(in_code())
    assert spec.environment == ("HVDX_SYNC", raw)


@pytest.mark.parametrize("raw", ["none", "", "  ", " none "])
def test_none_and_empty_are_no_strategy(raw):
    assert compression(raw) is None and sync(raw) is None


@pytest.mark.parametrize("variable, raw, reason", [
    ("HVDX_COMPRESSION", "topk(0.1", "not an expression (SyntaxError"),
    ("HVDX_COMPRESSION", "gzip", "unknown name 'gzip'"),
    ("HVDX_COMPRESSION", "fast(0.1)", "the preset fast is a bare name"),
    ("HVDX_COMPRESSION", "hvd.Compression.topk(0.1)", "neither a name nor a call"),
    ("HVDX_COMPRESSION", "__import__('os').system('x')", "neither a name nor a call"),
    ("HVDX_COMPRESSION", "topk(__import__('os').getpid())", "is not a Python literal"),
    ("HVDX_COMPRESSION", "topk(0.1 + 0.1)", "is not a Python literal"),
    ("HVDX_COMPRESSION", "topk(*[0.1])", "* and ** arguments are not accepted"),
    ("HVDX_COMPRESSION", "topk(0.1, 0.1, 'auto')", "too many positional arguments"),
    ("HVDX_COMPRESSION", "topk(0.1, ratio=0.2)", "multiple values for argument 'ratio'"),
    ("HVDX_COMPRESSION", "topk(2.0)", "ratio=2.0 must be in (0, 1]"),
    ("HVDX_COMPRESSION", "topk(mode=3)", "mode=3 must be one of"),
    ("HVDX_COMPRESSION", "topk(preset='fastest')", "preset='fastest' must be one of"),
    ("HVDX_SYNC", "DSSync(cross_every=4)", "unexpected keyword argument 'cross_every'"),
    ("HVDX_SYNC", "dssync()", "unknown name 'dssync'"),
    ("HVDX_SYNC", "topk(0.1)", "unknown name 'topk'"),
    ("HVDX_SYNC", "DSSync(intra_phases=0)", "intra_phases=0 must be an integer"),
    ("HVDX_SYNC", "Decentralized(graph='star')", "graph='star'"),
    ("HVDX_SYNC", "DSSync(); import os", "not an expression"),
    ("HVDX_SYNC", "(" * 1000, "not an expression"),
])
def test_a_value_not_accepted_is_a_value_error_naming_the_variable_and_the_forms(
        variable, raw, reason):
    with pytest.raises(ValueError) as info:
        environment.parse(variable, raw)
    message = str(info.value)
    assert message.startswith(f"{variable}={raw!r}: ") and reason in message
    assert f"{variable} accepts none, " in message


def test_nothing_is_evaluated(tmp_path):
    witness = tmp_path / "evaluated"
    for raw in (f"open({str(witness)!r}, 'w')", f"topk(open({str(witness)!r}, 'w'))"):
        with pytest.raises(ValueError):
            compression(raw)
    assert not witness.exists()


def test_asks_for_dssync_reads_the_name_only():
    assert environment.asks_for_dssync("DSSync")
    assert environment.asks_for_dssync("DSSync('shuffle', group_size=2)")
    assert not environment.asks_for_dssync("Decentralized()")
    assert not environment.asks_for_dssync("DSSync(")  # the entry point reports it
    assert not environment.asks_for_dssync(None)


def test_the_environment_fills_arguments_the_code_left_at_their_defaults(
        monkeypatch, capsys):
    monkeypatch.setenv("HVDX_COMPRESSION", "topk(0.1, 0.1)")
    monkeypatch.setenv("HVDX_SYNC", "Decentralized('ring')")
    chosen, synced, error = environment.choose(NONE, None, NONE, None, "Entry")
    assert (chosen, error) == (topk(0.1, 0.1), None)
    assert repr(synced) == repr(hvdx.Decentralized("ring"))
    # One spec per value: a TensorFlow tape, made every step, keeps its state on it.
    again = environment.choose(NONE, None, NONE, None, "Entry")
    assert again[0] is chosen and again[1] is synced
    assert capsys.readouterr().err.splitlines() == [
        "[hvdx] HVDX_COMPRESSION='topk(0.1, 0.1)': bidirectional TopK, ratio=0.1 "
        "downlink=0.1 mode=auto min_size=1024 warmup_steps=0 topk_method=exact "
        "sample_size=65536 seed=0 error_feedback=True selection=layerwise (Entry)",
        "[hvdx] HVDX_SYNC=\"Decentralized('ring')\": decentralized SGD, "
        "Decentralized(graph='ring', order='adapt_then_combine', mix_every=1, "
        "global_every=0, swa_start=None, swa_every=1, average_optimizer_state=False) "
        "(Entry)"]


def test_an_argument_in_the_code_wins_and_the_variable_is_ignored_aloud(
        monkeypatch, capsys):
    monkeypatch.setenv("HVDX_COMPRESSION", "fast")
    monkeypatch.setenv("HVDX_SYNC", "DSSync()")
    code_sync = hvdx.Decentralized()

    class Fp16:
        pass

    chosen, synced, error = environment.choose(Fp16, code_sync, NONE, None, "Entry")
    assert (chosen, synced, error) == (Fp16, code_sync, None)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "[hvdx] HVDX_COMPRESSION='fast': ignored: the code passes " \
                      "compression=Fp16 (Entry)"
    assert said[1].startswith("[hvdx] HVDX_SYNC='DSSync()': ignored: the code passes "
                              "sync=decentralized SGD, Decentralized(")


@pytest.mark.parametrize("from_environment", [True, False])
def test_rank_zero_describes_the_strategy_as_the_entry_point_fits_it(
        monkeypatch, capsys, from_environment):
    """A TopK preset under Adam runs without DGC's momentum correction: the line that
    names the strategy says momentum_correction=False, never the preset's True."""
    from hvdx.strategies.topk.presets import for_optimizer

    adam = [{"params": [], "lr": 0.001, "betas": (0.9, 0.999)}]
    fitted = []

    def fit(spec):
        fitted.append(spec)
        return for_optimizer(spec, "Adam", adam)[0]

    monkeypatch.setenv("HVDX_COMPRESSION", "fast")
    code = NONE if from_environment else topk(preset="fast")
    chosen, _, error = environment.choose(code, None, NONE, None, "Entry", fit=fit)
    assert error is None and len(fitted) == 1 and not chosen.momentum_correction
    said = [line for line in capsys.readouterr().err.splitlines() if "TopK, " in line]
    assert said and all(" momentum_correction=False" in line and
                        "momentum_correction=True" not in line for line in said), said
    # Where the preset's correction runs (SGD with momentum), the line says so.
    environment.forget()
    environment.choose(code, None, NONE, None, "Entry", fit=lambda spec: spec)
    said = [line for line in capsys.readouterr().err.splitlines() if "TopK, " in line]
    assert said and all("momentum_correction=True" in line for line in said), said


def test_unset_or_none_leaves_the_arguments_as_they_are(monkeypatch):
    assert environment.choose(NONE, None, NONE, None, "Entry") == (NONE, None, None)
    monkeypatch.setenv("HVDX_COMPRESSION", "none")
    assert environment.choose(NONE, None, NONE, None, "Entry") == (NONE, None, None)


def test_alone_a_value_not_accepted_raises_at_once(monkeypatch):
    monkeypatch.setenv("HVDX_SYNC", "DSSync(")
    with pytest.raises(ValueError, match=r"HVDX_SYNC='DSSync\('"):
        environment.choose(NONE, None, NONE, None, "Entry")


def test_init_switches_dynamic_process_sets_on_for_dssync_only(monkeypatch, capsys):
    monkeypatch.setenv("HVDX_SYNC", "DSSync('shuffle', group_size=2)")
    assert init_arguments((), {}) == ((), {"process_sets": "dynamic"})
    assert "hvd.init(process_sets=\"dynamic\")" in capsys.readouterr().err
    static = ["a static set"]
    assert init_arguments((), {"process_sets": static}) == ((), {"process_sets": static})
    assert init_arguments((None, static), {}) == ((None, static), {})
    monkeypatch.setenv("HVDX_SYNC", "Decentralized()")
    assert init_arguments((), {}) == ((), {})


def test_init_names_the_variable_a_rank_was_launched_with_differently():
    assert launch_difference([("fast", None), ("fast", "none")]) is None
    assert launch_difference([(None, ""), ("none", None)]) is None
    message = launch_difference([(None, "DSSync()"), (None, "DSSync()"), (None, None)])
    assert message.startswith("hvdx init: HVDX_SYNC differs between ranks (rank 0: "
                              "'DSSync()', rank 1: 'DSSync()', rank 2: unset); launch "
                              "every rank with the same value")
    assert "HVDX_COMPRESSION differs" in launch_difference([("fast", None), ("safe", None)])


def test_a_rank_launched_with_another_value_is_named_before_what_it_changed():
    """Ranks launched differently build different strategies: at different points, with
    other parameters; the variable is the cause to report."""
    from hvdx.core.fingerprint import Fingerprint, first_difference

    horovods = Fingerprint.build(parameters=[("w", "float32", (3,))],
                                 settings=[("compression", "none"), ("sync", None)])
    dssyncs = Fingerprint.build(settings=[("HVDX_SYNC", "DSSync()"), ("sync", "dssync")])
    assert first_difference([horovods, dssyncs]) == (
        "setting 'HVDX_SYNC' ('DSSync()') exists on rank 1 but not on rank 0")


# --- a refused value ends the job with its message alone --------------------------------

@pytest.mark.parametrize("variable, raw", [
    ("HVDX_COMPRESSION", "topk(ration=0.1)"),
    ("HVDX_COMPRESSION", "topk(2.0)"),
    ("HVDX_COMPRESSION", "topk(0.1"),
    ("HVDX_SYNC", "DSSync(group_size=3)"),
    ("HVDX_SYNC", "Decentralized(graph='star')"),
    ("HVDX_SYNC", "dssync"),
])
def test_init_refuses_a_value_the_entry_point_would_refuse_with_the_same_message(
        monkeypatch, variable, raw):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(VariableError) as at_init:
        init_arguments((), {}, environment.check_at_init)  # as hvd.init calls it
    with pytest.raises(VariableError) as at_entry:
        environment.choose(NONE, None, NONE, None, "Entry")
    assert str(at_init.value) == str(at_entry.value)
    assert str(at_init.value).startswith(f"{variable}={raw!r}: ")


def test_init_leaves_a_compression_name_it_does_not_know_to_the_entry_point(monkeypatch):
    """The script may register it after init (hvdx.register_compressor)."""
    monkeypatch.setenv("HVDX_COMPRESSION", "my_compressor(0.5)")
    assert init_arguments((), {}, environment.check_at_init) == ((), {})


def test_init_leaves_a_mixer_name_it_does_not_know_to_the_entry_point(monkeypatch):
    """The script may register it after init (hvdx.register_mixer)."""
    monkeypatch.setenv("HVDX_SYNC", "my_gossip(a=0.5, global_every=4)")
    assert init_arguments((), {}, environment.check_at_init) == ((), {})


@pytest.mark.parametrize("variable, raw", [
    ("HVDX_COMPRESSION", "fp16"), ("HVDX_COMPRESSION", "dssync"),
    ("HVDX_SYNC", "topk(0.1)"), ("HVDX_SYNC", "horovod")])
def test_init_refuses_a_name_no_script_may_register(monkeypatch, variable, raw):
    """Horovod's or a built-in strategy's name in the wrong variable: no registration
    can make it valid later, so init refuses it as the entry point would."""
    monkeypatch.setenv(variable, raw)
    with pytest.raises(VariableError) as at_init:
        init_arguments((), {}, environment.check_at_init)
    with pytest.raises(VariableError) as at_entry:
        environment.choose(NONE, None, NONE, None, "Entry")
    assert str(at_init.value) == str(at_entry.value)


def test_a_value_refused_for_this_job_names_the_variable():
    from types import SimpleNamespace

    from hvdx.strategy_contract import Job, resolve

    spec = sync("DSSync('shuffle', group_size=3)")
    everyone = object()  # Horovod's global process set
    job = Job(size=2, rank=0, horovod=SimpleNamespace(global_process_set=everyone),
              compression=NONE, no_compression=NONE, process_set=everyone,
              framework="torch")
    error = resolve(spec, job).error
    assert isinstance(error, VariableError)
    assert str(error).startswith("HVDX_SYNC=\"DSSync('shuffle', group_size=3)\": "
                                 "group_size=3 must be an integer from 1 to the number of "
                                 "ranks, 2. HVDX_SYNC accepts none, ")


class FakeMPI:
    """What the hook asks of mpi4py's ``MPI``, for one rank of ``size``."""

    class Ended(Exception):
        pass

    def __init__(self, rank, size):
        self.COMM_WORLD = self
        self.rank, self.size = rank, size

    def Is_finalized(self):
        return False

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Abort(self, code):
        raise FakeMPI.Ended(f"Abort({code})")


@pytest.mark.parametrize("rank, size, printed, ended", [
    (0, 1, "[hvdx] {}\n", None),  # Python then exits with status 1
    (0, 2, "[hvdx] {}\n", "_exit(1)"),
    (1, 2, "[hvdx rank 1] {}\n", "Abort(1)"),  # only if rank 0 has not ended the job
])
def test_a_variable_error_is_printed_alone_and_ends_the_rank_with_status_one(
        monkeypatch, capfd, rank, size, printed, ended):
    from hvdx.mpi import abort

    def _exit(code):
        raise FakeMPI.Ended(f"_exit({code})")

    slept = []
    monkeypatch.setattr(abort.os, "_exit", _exit)
    monkeypatch.setattr(abort.time, "sleep", slept.append)
    error = environment_variables.refused("HVDX_SYNC", "dssync", "unknown name 'dssync'")
    try:
        abort._end_on_variable_error(FakeMPI(rank, size), error)
        outcome = None
    except FakeMPI.Ended as end:
        outcome = str(end)
    assert outcome == ended
    assert capfd.readouterr().err == printed.format(error)
    # A rank other than 0 is silent for as long as rank 0 may take to end the job.
    assert (sum(slept) >= abort._SILENT_S) == (rank != 0)
