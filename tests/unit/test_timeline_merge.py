"""hvdx's exchanges merged into a Horovod timeline file (hvdx.mpi.timeline), file in,
file out: a hand-written timeline in Horovod 0.28.1's format (timeline.cc: a metadata
header whose first event carries start_time_since_epoch_in_micros, one process per
tensor, the file always ending in "}]"); the recorder's state as the wrappers of
Horovod's start_timeline, stop_timeline and shutdown drive it; a registered compressor's
span."""

import json

import numpy as np
import pytest

from hvdx.core.user_compression import Compressor
from hvdx.mpi import timeline
from hvdx.mpi.user_compression_exchange import UserCompressionSynchronizer

pytestmark = [pytest.mark.topk, pytest.mark.user_compression]

START = 1_700_000_000_000_000  # microseconds since the epoch

HOROVOD = (
    '[\n'
    '{"name": "process_name", "ph": "M", "pid": 0, "args": '
    '{"start_time_since_epoch_in_micros":' + str(START) + '}},\n'
    '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n'
    '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.weight"}},\n'
    '{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},\n'
    '{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},'
    '{"ph": "X", "name": "0", "ts": 110, "pid": 1, "dur": 0},'
    '{"ph": "E", "ts": 120, "pid": 1},'
    '{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.fc.bias"}},\n'
    '{"name": "process_sort_index", "ph": "M", "pid": 2, "args": {"sort_index": 2}},\n'
    '{"ph": "B", "name": "ALLREDUCE", "ts": 130, "pid": 2},'
    '{"ph": "E", "ts": 150, "pid": 2, "args": {"shape": [4]}}]')

SPANS = [("HVDX_TOPK_ALLGATHER", "topk", START + 200, START + 260, 96, 96),
         ("HVDX_NEIGHBOR_EXCHANGE", "neighbors float32", START + 300, START + 420, 4000, 4000),
         ("HVDX_TOPK_ALLGATHER", "topk", START + 500, START + 530, 80, 88)]


def write(path, text):
    path.write_text(text)
    return str(path)


def hvdx_events(events, start_pid):
    return [e for e in events if e["pid"] >= start_pid]


def test_spans_follow_horovods_processes_with_its_clock(tmp_path):
    path = write(tmp_path / "timeline.json", HOROVOD)
    assert timeline.merge_into(path, SPANS)
    text = (tmp_path / "timeline.json").read_text()
    # Horovod's text is kept as it was, and the file still ends as Horovod's does.
    assert text.startswith(HOROVOD[:-1]) and text.endswith("}]")
    events = json.loads(text)
    assert events[:len(json.loads(HOROVOD))] == json.loads(HOROVOD)
    ours = hvdx_events(events, 3)
    names = {e["pid"]: e["args"]["name"] for e in ours if e["name"] == "process_name"}
    assert names == {3: "hvdx: topk", 4: "hvdx: neighbors float32"}
    order = {e["pid"]: e["args"]["sort_index"] for e in ours
             if e["name"] == "process_sort_index"}
    assert order == {3: 3, 4: 4}
    spans = [(e["name"], e["pid"], e["ts"], e["dur"], e["args"]) for e in ours
             if e["ph"] == "X"]
    assert spans == [
        ("HVDX_TOPK_ALLGATHER", 3, 200, 60, {"bytes_sent": 96, "bytes_received": 96}),
        ("HVDX_NEIGHBOR_EXCHANGE", 4, 300, 120, {"bytes_sent": 4000, "bytes_received": 4000}),
        ("HVDX_TOPK_ALLGATHER", 3, 500, 30, {"bytes_sent": 80, "bytes_received": 88})]


def test_a_second_merge_adds_rows_after_the_first(tmp_path):
    path = write(tmp_path / "timeline.json", HOROVOD)
    assert timeline.merge_into(path, SPANS[:1])
    assert timeline.merge_into(path, SPANS[1:2])
    events = json.loads((tmp_path / "timeline.json").read_text())
    names = {e["pid"]: e["args"].get("name") for e in events
             if e.get("name") == "process_name"}
    assert names[3] == "hvdx: topk" and names[4] == "hvdx: neighbors float32"


def test_an_empty_file_gets_a_header_of_its_own(tmp_path):
    path = write(tmp_path / "timeline.json", "")
    assert timeline.merge_into(path, SPANS, began_us=START + 100)
    events = json.loads((tmp_path / "timeline.json").read_text())
    assert events[0]["args"] == {"start_time_since_epoch_in_micros": START + 100}
    assert [e["ts"] for e in events if e["ph"] == "X"] == [100, 200, 400]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {1, 2}


@pytest.mark.parametrize("text", ['[\n{"name": "process_name", "ph": "M", "pid": 0, "args',
                                  '{"not": "a list"}',
                                  '[{"ph": "B", "name": "ALLREDUCE", "ts": 1, "pid": 1}]'],
                         ids=["truncated", "not-a-list", "no-start-time"])
def test_a_file_that_is_not_horovods_json_is_left_alone_with_one_warning(
        tmp_path, capsys, text):
    path = write(tmp_path / "timeline.json", text)
    assert not timeline.merge_into(path, SPANS)
    assert not timeline.merge_into(path, SPANS)
    assert (tmp_path / "timeline.json").read_text() == text
    err = capsys.readouterr().err
    assert err.count("[hvdx]") == 1 and path in err and "left as it is" in err


def test_a_missing_file_is_not_created(tmp_path, capsys):
    path = str(tmp_path / "missing.json")
    assert not timeline.merge_into(path, SPANS)
    assert not (tmp_path / "missing.json").exists()
    assert "could not read" in capsys.readouterr().err


@pytest.fixture
def recorder(monkeypatch):
    """hvdx.mpi.timeline's recording state, put back afterwards."""
    for name in ("active", "_path", "_spans", "_dropped", "_began_us"):
        monkeypatch.setattr(timeline, name, getattr(timeline, name))
    monkeypatch.setattr(timeline, "_spans", [])
    yield timeline


def test_recording_follows_horovods_writer(recorder, tmp_path, monkeypatch):
    path = write(tmp_path / "env.json", HOROVOD)
    monkeypatch.setenv("HOROVOD_TIMELINE", path)
    recorder.after_init(rank=1)  # only rank 0 writes the timeline
    assert not recorder.active
    recorder.record("HVDX_TOPK_ALLGATHER", "topk", recorder.now())
    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")  # no file until start_timeline
    recorder.after_init(rank=0)
    assert not recorder.active
    monkeypatch.setenv("HOROVOD_TIMELINE", path)
    recorder.after_init(rank=0)
    assert recorder.active
    began = recorder.now()
    recorder.record("HVDX_TOPK_ALLGATHER", "topk", began, 8, 16)
    recorder.record("HVDX_TOPK_ALLGATHER", "topk", 0)  # begun before recording: dropped
    recorder.finish()
    assert not recorder.active
    events = json.loads((tmp_path / "env.json").read_text())
    ours = [e for e in events if e.get("ph") == "X" and e["name"].startswith("HVDX")]
    assert len(ours) == 1 and ours[0]["args"] == {"bytes_sent": 8, "bytes_received": 16}
    assert ours[0]["ts"] >= began - START


def test_start_stop_and_shutdown_wrappers_merge_after_horovod(recorder, tmp_path):
    calls = []
    first, second = (write(tmp_path / n, HOROVOD) for n in ("first.json", "second.json"))
    start = recorder.wrap_start_timeline(lambda p, m=False: calls.append(("start", p)),
                                         rank=lambda: 0)
    stop = recorder.wrap_stop_timeline(lambda: calls.append(("stop",)))
    shutdown = recorder.wrap_shutdown(lambda: calls.append(("shutdown",)))
    start(first)
    recorder.record("HVDX_TOPK_ALLTOALL", "topk", recorder.now())
    start(second)  # Horovod closed the first file: merged now
    assert len(json.loads(open(first).read())) == len(json.loads(HOROVOD)) + 3
    recorder.record("HVDX_TOPK_ALLTOALL", "topk", recorder.now())
    stop()
    assert len(json.loads(open(second).read())) == len(json.loads(HOROVOD)) + 3
    shutdown()  # nothing recorded since: the files stay as they are
    assert len(json.loads(open(second).read())) == len(json.loads(HOROVOD)) + 3
    assert calls == [("start", first), ("start", second), ("stop",), ("shutdown",)]


def test_nothing_recorded_leaves_horovods_file_untouched(recorder, tmp_path):
    path = write(tmp_path / "timeline.json", HOROVOD)
    before = (tmp_path / "timeline.json").stat().st_mtime_ns
    recorder.wrap_start_timeline(lambda p, m=False: None, rank=lambda: 0)(path)
    recorder.finish()
    assert (tmp_path / "timeline.json").read_text() == HOROVOD
    assert (tmp_path / "timeline.json").stat().st_mtime_ns == before


class Half(Compressor):
    """A registered compressor's shape: the values as float16."""

    def compress(self, x, step, name):
        return [x.astype("float16")]

    def decompress(self, payloads, shape, dtype, step, name):
        return payloads[0].astype(dtype).reshape(shape)


class TwoRanks:
    """A communicator whose other rank sends what this one does."""

    def Get_rank(self):
        return 0

    def allgather(self, value):
        return [value, value]


def test_a_registered_compressors_allgather_is_a_span_with_its_payload_bytes(recorder):
    sync = UserCompressionSynchronizer(["w", "b"], Half(), TwoRanks())
    arrays = [np.ones(10, np.float32), np.ones(3, np.float32)]
    sync.synchronize_arrays(arrays)  # no timeline: nothing kept
    assert recorder._spans == []
    recorder.active = True
    sync.synchronize_arrays(arrays)
    assert [s[:2] + s[4:] for s in recorder._spans] == \
        [("HVDX_COMPRESSION_ALLGATHER", "compression Half", 26, 26)]
    assert recorder._spans[0][2] <= recorder._spans[0][3]
