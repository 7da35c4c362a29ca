"""Names are data: a provider or rpc name matplotlib would read as mathtext still renders."""

import io

import pytest

pytest.importorskip("matplotlib")

from rpcbus.analytics import report  # noqa: E402


def test_names_with_dollar_signs_render_as_text():
    rows = [{"rpc": "pay$\\x$", "provider": "p$\\notacommand$", "calls": 10},
            {"rpc": "ok", "provider": "$$", "calls": 5}]
    fig = report._heatmap(rows)
    fig.savefig(io.BytesIO(), format="png")          # mathtext would raise here
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "p\\$\\notacommand\\$" in labels
