"""The report's bar charts keep their legends off the bars (inside the axes a legend hid
the last providers' bars whenever every corner held a tall one)."""

import matplotlib

from rpcbus.analytics import report

matplotlib.use("Agg")


def _overlaps(fig):
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    return [bar for bar in ax.patches if bar.get_height() > 0
            and bar.get_window_extent().overlaps(legend)]


def test_latency_and_fairness_legends_cover_no_bar():
    rows = [{"provider": f"p{i}", "rpc": "svc1.call", "served_by": "n1",
             "p50_s": 0.05, "p95_s": 0.08, "p99_s": 0.1, "calls": 100 - i,
             "share": 0.5, "expected_share": 0.5, "took": None} for i in range(12)]
    assert _overlaps(report._latency(rows, set())) == []
    assert _overlaps(report._fairness(rows, set())) == []
