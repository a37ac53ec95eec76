"""`hvdx bench --selection` reports the selection timings as ratios of one run."""

import pytest

from hvdx.bench.selection import measure, render

pytestmark = [pytest.mark.topk]


def test_selection_timings_are_reported_with_recall_and_ratios():
    report = measure(n=200_000, ratio=0.01, repeat=1)
    assert report["k"] == 2_000 and report["recall"] > 0.9
    text = render(report)
    assert "x abs" in text and "torch.topk" in text


def test_topk_bytes_table_sets_each_mode_against_horovod():
    from hvdx.bench.topk_bytes import render as render_bytes

    row = {"ranks": 4, "mode": "sharded", "model_bytes": 4_000_000, "up_sent": 60e3,
           "up_received": 60e3, "down_sent": 60e3, "down_received": 60e3,
           "dense_sent": 1e3, "dense_received": 1e3}
    text = render_bytes([row])
    # 121 KB against Horovod's 2 * 3/4 * 4 MB = 6 MB each way: 2.02 %.
    assert "| 4 | sharded | 60.0 | 60.0 | 60.0 | 60.0 | 1.0 | 121.0 | 121.0 | 6000.0 | 2.02 |" \
        in text
