"""``HVDX_LOG_LEVEL`` chooses which of hvdx's lines about the job's strategies rank 0
prints: ``info`` (the default) what runs and the warnings, ``warning`` the warnings only,
``error`` neither, ``debug`` what ``info`` prints, on every rank."""

import pytest

from hvdx import environment, log
from hvdx.strategies.topk.spec import topk

pytestmark = [pytest.mark.topk, pytest.mark.dssync]

NONE = object()  # a framework's Compression.none


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in ("HVDX_COMPRESSION", "HVDX_SYNC", "HVDX_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(log, "_warned", set())
    environment.forget()
    yield
    environment.forget()


def printed(capsys, monkeypatch, level):
    """What rank 0 prints while an entry point takes a TopK the code passes, and ignores
    ``HVDX_SYNC`` for the code's ``sync``, at ``HVDX_LOG_LEVEL=level``."""
    if level is not None:
        monkeypatch.setenv("HVDX_LOG_LEVEL", level)
    monkeypatch.setenv("HVDX_SYNC", "DSSync()")
    environment.choose(topk(0.1, 0.1), "a sync", NONE, None, "Entry")
    return capsys.readouterr().err.splitlines()


CODE = ("[hvdx] compression in the code: bidirectional TopK, ratio=0.1 downlink=0.1 "
        "mode=auto min_size=1024 warmup_steps=0 topk_method=exact sample_size=65536 "
        "seed=0 error_feedback=True selection=layerwise (Entry)")
IGNORED = "[hvdx] HVDX_SYNC='DSSync()': ignored: the code passes sync='a sync' (Entry)"


@pytest.mark.parametrize("level, lines", [
    (None, [CODE, IGNORED]),
    ("info", [CODE, IGNORED]),
    ("INFO ", [CODE, IGNORED]),
    ("debug", [CODE, IGNORED]),
    ("warning", [IGNORED]),
    ("error", []),
])
def test_the_level_chooses_the_lines(capsys, monkeypatch, level, lines):
    assert printed(capsys, monkeypatch, level) == lines


def test_a_level_not_known_is_info_and_rank_zero_says_so_once(capsys, monkeypatch):
    assert printed(capsys, monkeypatch, "verbose") == [
        "[hvdx] HVDX_LOG_LEVEL='verbose' is not one of debug, info, warning, error; "
        "hvdx logs at info", CODE, IGNORED]
    assert log.level() == "info" and capsys.readouterr().err == ""


def test_a_strategy_in_the_code_is_said_once_per_entry_point_and_setting(capsys):
    for _ in range(3):  # a TensorFlow tape is made every step, with the same spec
        environment.choose(topk(0.1, 0.1), None, NONE, None, "Tape")
    environment.choose(topk(0.1, 0.1), None, NONE, None, "Optimizer")
    environment.choose(topk(0.2), None, NONE, None, "Optimizer")
    said = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[-1] for line in said] == ["Tape)", "Optimizer)", "Optimizer)"]
    assert "unidirectional TopK, ratio=0.2 " in said[-1]


def test_a_line_silenced_is_said_when_the_level_allows_it(capsys, monkeypatch):
    monkeypatch.setenv("HVDX_LOG_LEVEL", "warning")
    environment.choose(topk(0.1, 0.1), None, NONE, None, "Entry")
    monkeypatch.setenv("HVDX_LOG_LEVEL", "info")
    environment.choose(topk(0.1, 0.1), None, NONE, None, "Entry")
    assert capsys.readouterr().err.splitlines() == [CODE]


def test_horovods_own_compression_and_an_invalid_spec_are_not_said(capsys):
    class Fp16:
        pass

    environment.choose(Fp16, None, NONE, None, "Entry")
    assert capsys.readouterr().err == ""


def test_say_prints_on_rank_zero_and_at_debug_on_every_rank(capsys, monkeypatch):
    log.say("what runs", rank=1)
    log.say("what runs", rank=0)
    monkeypatch.setenv("HVDX_LOG_LEVEL", "debug")
    log.say("what runs", rank=1)
    assert capsys.readouterr().err.splitlines() == ["[hvdx] what runs",
                                                    "[hvdx rank 1] what runs"]
