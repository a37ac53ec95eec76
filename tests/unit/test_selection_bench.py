"""`hvdx bench --selection` reports the selection timings as ratios of one run."""

from hvdx.bench.selection import measure, render


def test_selection_timings_are_reported_with_recall_and_ratios():
    report = measure(n=200_000, ratio=0.01, repeat=1)
    assert report["k"] == 2_000 and report["recall"] > 0.9
    text = render(report)
    assert "x abs" in text and "torch.topk" in text
