"""The report of ``rpcbus analyze``: one self-contained HTML file (charts embedded as PNG)
that says in plain words what the tables found, with the charts beside it as files,
and ``findings.json``: the small tables (all but the per-minute and per-hour ones) as
JSON for scripts.

Made from the small tables the job computed (``TABLES``) and each node's throughput,
drawn with matplotlib (Agg: no screen needed). The findings are
worded and ranked by analytics/report_findings.py. Charts show every flagged provider
(named in red) and the busiest others up to ``TOP``; the tables hold everything.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import time
from collections import defaultdict
from typing import Any

from rpcbus.analytics.report_findings import duration, findings, in_use
from rpcbus.analytics.report_findings import ms as _ms
from rpcbus.analytics.report_findings import pct as _pct
from rpcbus.analytics.report_findings import when as _when

TOP = 24          # bars on a chart: every flagged pair, then the busiest others
HEAT_MAX = 40     # rows and columns of the heatmap
TABLES = ("per_provider", "fairness", "outliers", "episodes", "hot_rpcs", "peak_minutes",
          "weights", "clock_skew", "silent")


def write(out: str, directory: str | None, tables: dict[str, list[dict[str, Any]]],
          throughput: dict[str, dict[int, float]], history: dict[str, int] | None = None) -> str:
    """Write ``report.html`` and the PNGs into ``directory`` (default ``out/report``, which
    must then be a local path); returns the HTML file's path. ``tables``: at least
    ``TABLES`` (analytics/findings.py); ``throughput``: per serving node, calls/s per
    minute; ``history``: rows read, skipped and left out as duplicates (said in the report
    and findings.json)."""
    directory = directory or os.path.join(out.removeprefix("file://"), "report")
    os.makedirs(directory, exist_ok=True)
    t = {name: tables[name] for name in TABLES}
    with open(os.path.join(directory, "findings.json"), "w", encoding="utf-8") as f:
        json.dump({**t, "history": history or {}}, f, indent=1)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flagged = ({(o["rpc"], o["provider"]) for o in t["outliers"]}
               | {(ep["rpc"], ep["provider"]) for ep in t["episodes"]})
    unfair = {(r["rpc"], r["provider"]) for r in t["fairness"] if r["took"]}
    charts = [("throughput", "Throughput per serving node (calls/s, per minute)",
               _throughput(throughput)),
              ("latency", "Latency percentiles per provider (interpolated in the "
               "histogram buckets)", _latency(t["per_provider"], flagged)),
              ("fairness", "Share of calls against the share the weights should give",
               _fairness(t["fairness"], unfair)),
              ("heatmap", "Calls per rpc and provider",
               _heatmap(t["per_provider"], flagged | unfair))]
    made = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    parts = [f"<h1>rpcbus load history report</h1><p>Made {made} from "
             f"<code>{html.escape(out)}</code>. {_span(t['per_provider'], t['clock_skew'])}"
             f"{_rows(history)}</p>",
             "<h2>Findings</h2><p><small>Most severe first: doubts about the history itself, "
             "then problems by the calls they touched, then what is worth knowing, then "
             "weights that would change.</small></p><ul>"
             + "".join(f"<li>{line}</li>" for line in findings(t)) + "</ul>",
             "<p><small>Latency percentiles (p50, p95, p99) come from the histograms the "
             "nodes record (bucket bounds …, 1, 2.5, 5, 10, 25, 50, 100 ms, …): the bucket "
             "that holds a percentile is exact, the value within it is interpolated "
             "(log-linearly) and kept within the sampled min and max, so it is off by at "
             "most that bucket's width (2-2.5×) and usually far less. Mean latencies are "
             "exact over the sampled calls (one in 16).</small></p>"]
    for name, title, fig in charts:
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        plt.close(fig)      # pyplot keeps every figure until closed
        png = buf.getvalue()
        with open(os.path.join(directory, f"{name}.png"), "wb") as f:
            f.write(png)
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{name}' src='data:image/png;"
                     f"base64,{base64.b64encode(png).decode()}'>")
    parts.append(_weights_table(t["weights"]))
    path = os.path.join(directory, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("<!doctype html><meta charset='utf-8'>"
                "<meta name='viewport' content='width=device-width, initial-scale=1'>"
                "<title>rpcbus report</title><style>"
                "body{font:15px system-ui,sans-serif;max-width:70em;margin:2em auto;"
                "padding:0 1em;color:#222}"
                "img{max-width:100%;height:auto}table{border-collapse:collapse}"
                ".wide{overflow-x:auto}"
                "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
                "td:first-child,td:nth-child(2){text-align:left}</style>"
                + "\n".join(parts))
    return path


def _weights_table(weights: list[dict[str, Any]]) -> str:
    """The recommended weights, changes first (largest first); the unchanged folded."""
    def change(w: dict[str, Any]) -> float:
        return float(w["weight"] - (w.get("current") or 1.0))

    def row(w: dict[str, Any]) -> list[str]:
        return [w["rpc"], w["provider"], in_use(w), f"{w['weight']:g}",
                f"{change(w):+.3g}" if abs(change(w)) >= 0.0005 else "", f"{w['calls']:,}",
                _pct(w["recent_failure_rate"]), _ms(w["recent_latency_s"])]

    head = ["rpc", "provider", "now", "recommended", "change", "calls weighed",
            "recent failure rate", "recent mean latency"]
    changed = sorted((w for w in weights if abs(change(w)) >= 0.0005),
                     key=lambda w: (-abs(change(w)), w["rpc"], w["provider"]))
    same = sorted((w for w in weights if abs(change(w)) < 0.0005),
                  key=lambda w: (w["rpc"], w["provider"]))
    text = ("<h2>Recommended weights</h2><p><small>weights.json holds them all; "
            "nodes load it as <code>rpc.weights_file</code>.</small></p>")
    if changed:
        text += "<div class='wide'>" + _table(head, [row(w) for w in changed]) + "</div>"
    else:
        text += "<p>No weight would change.</p>"
    if same:
        text += (f"<details><summary>{len(same):,} unchanged</summary><div class='wide'>"
                 + _table(head, [row(w) for w in same]) + "</div></details>")
    return text


def _rows(history: dict[str, int] | None) -> str:
    """What was read, and what was left out and why (a warning when anything was)."""
    if not history:
        return ""
    text = f" {history['rows_read']:,} history rows read."
    left = [f"{history[k]:,} {why}" for k, why in (
        ("rows_skipped", "skipped (another schema version, unreadable, or a line over "
                         "1 MiB)"),
        ("rows_duplicate", "exact copies of another row (a file copied twice?)"))
        if history.get(k)]
    if left:
        text += " <b>Left out: " + "; ".join(left) + ".</b>"
    return text


def _throughput(series: dict[str, dict[int, float]]) -> Any:
    import matplotlib.pyplot as plt

    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for node in sorted(series):
        points = sorted(series[node].items())
        ax.plot([_minutes_dt(m) for m, _ in points], [v for _, v in points], label=_plain(node))
    ax.set_ylabel("calls/s")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_plain_numbers())
    ax.legend(loc="upper left", fontsize="small", ncol=max(1, len(series) // 8))
    fig.autofmt_xdate()
    return fig


def _latency(per_provider: list[dict[str, Any]], flagged: set[tuple[str, str]]) -> Any:
    import matplotlib.pyplot as plt

    rows = _busiest([r for r in per_provider if r["p99_s"]], flagged)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(rows) + 2), 4))
    x = range(len(rows))
    values = [r[q] * 1000 for r in rows for q in ("p50_s", "p95_s", "p99_s") if r[q]]
    floor = 10 ** math.floor(math.log10(min(values) / 2))  # a decade below: no slivers
    for i, (q, color) in enumerate((("p50_s", "#8ab"), ("p95_s", "#469"), ("p99_s", "#123"))):
        ax.bar([v + (i - 1) * 0.27 for v in x], [(r[q] or 0) * 1000 - floor for r in rows],
               bottom=floor, width=0.27, label=q[:-2], color=color)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor, top=max(values) * 1.5)
    ax.yaxis.set_major_formatter(_plain_numbers())
    ax.yaxis.set_minor_formatter(_plain_numbers(minor=True))
    ax.set_ylabel("ms (log scale)")
    _provider_ticks(ax, rows, flagged)
    _legend_above(ax, "red names: flagged")
    return fig


def _fairness(fairness: list[dict[str, Any]], flagged: set[tuple[str, str]]) -> Any:
    import matplotlib.pyplot as plt

    rows = _busiest([r for r in fairness if r["share"] is not None
                     and r["expected_share"] is not None], flagged)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(8, 0.3 * len(rows) + 2), 4))
    x = range(len(rows))
    ax.bar([v - 0.2 for v in x], [r["share"] * 100 for r in rows], width=0.4, label="share",
           color=["#c33" if r["took"] else "#469" for r in rows])
    ax.bar([v + 0.2 for v in x], [r["expected_share"] * 100 for r in rows], width=0.4,
           label="expected (weights)", color="#bbb")
    ax.set_ylabel("% of the rpc's calls")
    ax.yaxis.set_major_formatter(_plain_numbers())
    _provider_ticks(ax, rows, flagged)
    _legend_above(ax, "red: flagged")
    return fig


def _legend_above(ax: Any, title: str) -> None:
    """The legend in a row above the plot, where it hides no bar (inside, "best" still
    covered the last providers' bars when every place was taken)."""
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize="small",
              title=title, title_fontsize="small", frameon=False)


def _plain_numbers(minor: bool = False) -> Any:
    """Tick labels as plain numbers (1, 2.5, 100; never 6×10⁰); minor ticks only at 2
    and 5 of each decade, so a log axis reads without crowding."""
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _: Any) -> str:
        if v <= 0:
            return "0"
        if minor and round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6) not in (2, 5):
            return ""
        return f"{v:,.6g}"
    return FuncFormatter(label)


def _busiest(rows: list[dict[str, Any]],
             flagged: set[tuple[str, str]] = frozenset()) -> list[dict[str, Any]]:
    """The (rpc, provider) rows a chart shows, in rpc, provider order: every flagged one
    (a slow or starved provider gets few calls, yet it is what the chart is for), then
    the busiest others up to ``TOP`` in all."""
    keep = [r for r in rows if (r["rpc"], r["provider"]) in flagged]
    rest = sorted((r for r in rows if (r["rpc"], r["provider"]) not in flagged),
                  key=lambda r: -r["calls"])
    top = keep + rest[:max(0, TOP - len(keep))]
    return sorted(top, key=lambda r: (r["rpc"], r["provider"]))


def _plain(text: str) -> str:
    """A name as chart text: ``$`` escaped, so matplotlib never reads it as mathtext."""
    return text.replace("$", r"\$")


def _provider_ticks(ax: Any, rows: list[dict[str, Any]],
                    flagged: set[tuple[str, str]] = frozenset()) -> None:
    ax.set_xticks(range(len(rows)), [_plain(f"{r['provider']}\n{r['rpc']}") for r in rows],
                  fontsize=7, rotation=60, ha="right")
    for label, r in zip(ax.get_xticklabels(), rows, strict=True):
        if (r["rpc"], r["provider"]) in flagged:
            label.set_color("#c33")


def _heatmap(per_provider: list[dict[str, Any]],
             flagged: set[tuple[str, str]] = frozenset()) -> Any:
    """Rows and columns chosen together: the rpcs of flagged pairs first, then the busiest,
    each bringing its providers, while both stay within ``HEAT_MAX``; providers ordered by
    the first rpc they serve, so each rpc's providers sit together. Log colours; a pair
    with no calls is blank."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    calls: dict[tuple[str, str], int] = {(r["rpc"], r["provider"]): r["calls"]
                                         for r in per_provider}
    if not calls:
        return None
    by_rpc: dict[str, int] = defaultdict(int)
    serving: dict[str, list[str]] = defaultdict(list)
    for (rpc, provider), n in sorted(calls.items()):
        by_rpc[rpc] += n
        serving[rpc].append(provider)
    order = sorted(by_rpc, key=lambda k: (not any((k, p) in flagged for p in serving[k]),
                                          -by_rpc[k], k))
    rpcs: list[str] = []
    providers: list[str] = []
    for rpc in order:
        more = [p for p in serving[rpc] if p not in providers]
        if rpcs and (len(rpcs) >= HEAT_MAX or len(providers) + len(more) > HEAT_MAX):
            continue
        rpcs.append(rpc)
        providers += more
    import numpy as np

    grid = np.ma.masked_less_equal(
        np.array([[calls.get((rpc, p), 0) for p in providers] for rpc in rpcs], dtype=float),
        0)
    fig, ax = plt.subplots(figsize=(max(5, 0.22 * len(providers) + 3),
                                    max(2.5, 0.22 * len(rpcs) + 1.5)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto",
                      norm=LogNorm(vmin=max(1, grid.min()), vmax=max(2, grid.max())))
    small = 8 if max(len(rpcs), len(providers)) <= 30 else 6
    ax.set_xticks(range(len(providers)), [_plain(p) for p in providers], rotation=90,
                  fontsize=small)
    ax.set_yticks(range(len(rpcs)), [_plain(r) for r in rpcs], fontsize=small)
    left = len(by_rpc) - len(rpcs)
    if left:
        ax.set_title(f"{len(rpcs)} of {len(by_rpc)} rpcs (those with findings, then the "
                     f"busiest); per_provider has all", fontsize=8)
    fig.colorbar(image, ax=ax, label="calls")
    return fig


def _table(head: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>"
                      for row in rows) + "</table>")


def _span(per_provider: list[dict[str, Any]], skew: list[dict[str, Any]]) -> str:
    if not per_provider:
        return "The history is empty."
    first = min(r["first_window"] for r in per_provider)
    last = max(r["last_window"] for r in per_provider)
    calls = sum(r["calls"] for r in per_provider)
    text = (f"History from {_when(first)} to {_when(last)} ({duration(last - first)}): "
            f"{calls:,} attempts, {len({r['provider'] for r in per_provider})} providers, "
            f"{len({r['rpc'] for r in per_provider})} rpcs.")
    skew = [s for s in skew if s.get("since") is None]   # a leap is taken back already
    if skew:
        text += (" <b>That span includes the clock skew below ("
                 + ", ".join(f"{html.escape(s['node'])} {s['offset_s']:+,.0f} s" for s in skew)
                 + "): the cluster's real span is shorter.</b>")
    return text


def _minutes_dt(t: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc)
