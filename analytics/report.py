"""The report of ``rpcbus analyze``: one self-contained HTML file (charts embedded as PNG)
that says in plain words what the tables found, with the charts beside it as files,
and ``findings.json``: the small tables (all but the per-minute and per-hour ones) as
JSON for scripts.

Reads the small tables the job wrote (``per_provider``, ``fairness``, ``outliers``,
``hot_rpcs``, ``peak_minutes``, ``weights``, and ``per_minute`` summed per node) back
through Spark and
draws with matplotlib (Agg: no screen needed). Charts show every flagged provider and
the busiest others up to ``TOP``; the tables hold everything.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import time
from collections import defaultdict
from typing import Any

TOP = 24


def write(spark: Any, out: str, directory: str | None = None,
          history: dict[str, int] | None = None) -> str:
    """Write ``report.html`` and the PNGs into ``directory`` (default ``out/report``, which
    must then be a local path); returns the HTML file's path. ``history``: rows read,
    skipped and left out as duplicates (said in the report and findings.json)."""
    directory = directory or os.path.join(out.removeprefix("file://"), "report")
    os.makedirs(directory, exist_ok=True)
    from pyspark.sql import functions as F

    t = {name: [r.asDict() for r in spark.read.parquet(f"{out}/{name}").collect()]
         for name in ("per_provider", "fairness", "outliers", "hot_rpcs", "peak_minutes",
                      "weights")}
    with open(os.path.join(directory, "findings.json"), "w", encoding="utf-8") as f:
        json.dump({**t, "history": history or {}}, f, indent=1)
    t["per_minute"] = [r.asDict() for r in spark.read.parquet(f"{out}/per_minute")
                       .groupBy("served_by", "period_start").agg(F.sum("calls").alias("calls"))
                       .collect()]   # per node and minute: small even for a long history
    import matplotlib

    matplotlib.use("Agg")
    charts = [("throughput", "Throughput per serving node (calls/s, per minute)",
               _throughput(t["per_minute"])),
              ("latency", "Latency percentiles per provider (merged histograms)",
               _latency(t["per_provider"], {(o["rpc"], o["provider"]) for o in t["outliers"]})),
              ("fairness", "Share of calls against the share the weights should give",
               _fairness(t["fairness"])),
              ("heatmap", "Calls per rpc and provider", _heatmap(t["per_provider"]))]
    made = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
    parts = [f"<h1>rpcbus load history report</h1><p>Made {made}"
             f" from <code>{html.escape(out)}</code>. {_span(t['per_provider'])}"
             f"{_rows(history)}</p>",
             "<h2>Findings</h2><ul>" + "".join(f"<li>{line}</li>" for line in findings(t))
             + "</ul>", "<p><small>Latency percentiles (p50, p95, p99) are the upper bounds "
             "of the histogram buckets the nodes record (…, 10, 25, 50, 100, 250 ms, …): the "
             "true value lies in the bucket below the bound, so a figure may overstate it "
             "up to 2.5×. Mean latencies are exact over the sampled calls.</small></p>"]
    for name, title, fig in charts:
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        fig.clf()
        png = buf.getvalue()
        with open(os.path.join(directory, f"{name}.png"), "wb") as f:
            f.write(png)
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{name}' src='data:image/png;"
                     f"base64,{base64.b64encode(png).decode()}'>")
    parts.append("<h2>Recommended weights</h2>" + _table(
        ["rpc", "provider", "calls", "recent failure rate", "recent mean latency", "weight"],
        [[w["rpc"], w["provider"], f"{w['calls']:,}", _pct(w["recent_failure_rate"]),
          _ms(w["recent_latency_s"]), f"{w['weight']:g}"]
         for w in sorted(t["weights"], key=lambda w: (w["rpc"], w["provider"]))]))
    path = os.path.join(directory, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("<!doctype html><meta charset='utf-8'><title>rpcbus report</title><style>"
                "body{font:15px system-ui,sans-serif;max-width:70em;margin:2em auto;color:#222}"
                "img{max-width:100%}table{border-collapse:collapse}"
                "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
                "td:first-child,td:nth-child(2){text-align:left}</style>"
                + "\n".join(parts))
    return path


def _rows(history: dict[str, int] | None) -> str:
    """What was read, and what was left out and why (a warning when anything was)."""
    if not history:
        return ""
    text = f" {history['rows_read']:,} history rows read."
    left = [f"{history[k]:,} {why}" for k, why in (
        ("rows_skipped", "skipped (another schema version, or unreadable)"),
        ("rows_duplicate", "left out as exact copies of another row (a file copied twice?)"))
        if history.get(k)]
    if left:
        text += " <b>Left out: " + "; ".join(left) + ".</b>"
    return text


def findings(t: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The flagged findings of the tables, one sentence each (HTML-escaped)."""
    e = html.escape
    lines = []
    for o in sorted(t["outliers"], key=lambda o: (o["rpc"], o["provider"], o["kind"])):
        if o["kind"] == "slow":
            lines.append(f"<b>{e(o['provider'])}</b> is slow on <b>{e(o['rpc'])}</b>: p99 "
                         f"{_ms(o['value'])} against a median of {_ms(o['peers_median'])} "
                         f"for its {o['peers']} peer(s).")
        else:
            lines.append(f"<b>{e(o['provider'])}</b> is failing on <b>{e(o['rpc'])}</b>: "
                         f"{_pct(o['value'])} of its calls failed or timed out, against "
                         f"{_pct(o['peers_median'])} for its peers.")
    for f in sorted(t["fairness"], key=lambda f: (f["rpc"], f["provider"])):
        if f["took"] and not f.get("because_of"):
            lesser = sorted(g["provider"] for g in t["fairness"]
                            if g["rpc"] == f["rpc"] and f["provider"] in (g.get("because_of")
                                                                          or "").split(","))
            also = (f" Its peers took less as a result: {e(', '.join(lesser))}."
                    if lesser else "")
            lines.append(f"<b>{e(f['provider'])}</b> took {f['took']} than its share of "
                         f"<b>{e(f['rpc'])}</b>: {_pct(f['share'])} of the calls where its "
                         f"weight gives {_pct(f['expected_share'])} ({f['calls']:,} calls, "
                         f"{f['expected_calls']:,.0f} expected).{also}")
    for h in sorted(t["hot_rpcs"], key=lambda h: h["rank"]):
        if h["hot"]:
            lines.append(f"<b>{e(h['rpc'])}</b> is hot: {_pct(h['share'])} of all calls "
                         f"({h['calls_per_s']:,.1f} calls/s on average, "
                         f"{h['peak_minute_calls_per_s']:,.1f} in its busiest minute).")
    peaks = sorted((p for p in t["peak_minutes"] if p["rpc"] == "*"), key=lambda p: p["rank"])
    if peaks:
        lines.append("Busiest minutes overall: " + "; ".join(
            f"{_when(p['minute'])} ({p['calls_per_s']:,.1f} calls/s, p99 {_ms(p['p99_s'])})"
            for p in peaks) + ".")
    lowered = [w for w in t["weights"] if w["weight"] < 0.95]
    for w in sorted(lowered, key=lambda w: w["weight"]):
        lines.append(f"Recommended weight {w['weight']:g} for <b>{e(w['provider'])}</b> on "
                     f"<b>{e(w['rpc'])}</b> (recent failure rate "
                     f"{_pct(w['recent_failure_rate'])}, speed against peers {w['speed']:.2f}).")
    if not lines:
        lines.append("Nothing stands out: no provider is unfairly loaded, slow or failing "
                     "against its peers.")
    return lines


def _throughput(per_minute: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in per_minute:
        series[r["served_by"]][r["period_start"]] += r["calls"] / 60.0
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for node in sorted(series):
        points = sorted(series[node].items())
        ax.plot([_minutes_dt(m) for m, _ in points], [v for _, v in points], label=_plain(node))
    ax.set_ylabel("calls/s")
    ax.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    return fig


def _latency(per_provider: list[dict[str, Any]], flagged: set[tuple[str, str]]) -> Any:
    import matplotlib.pyplot as plt

    rows = _busiest([r for r in per_provider if r["p99_s"]], flagged)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    x = range(len(rows))
    for i, (q, color) in enumerate((("p50_s", "#8ab"), ("p95_s", "#469"), ("p99_s", "#123"))):
        ax.bar([v + (i - 1) * 0.27 for v in x], [r[q] * 1000 for r in rows], width=0.27,
               label=q[:-2], color=color)
    ax.set_yscale("log")
    ax.set_ylabel("ms (bucket upper bound)")
    _provider_ticks(ax, rows)
    ax.legend(fontsize="small")
    return fig


def _fairness(fairness: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    rows = _busiest([r for r in fairness if r["share"] is not None
                     and r["expected_share"] is not None],
                    {(r["rpc"], r["provider"]) for r in fairness if r["took"]})
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 4))
    x = range(len(rows))
    ax.bar([v - 0.2 for v in x], [r["share"] * 100 for r in rows], width=0.4, label="share",
           color=["#c33" if r["took"] else "#469" for r in rows])
    ax.bar([v + 0.2 for v in x], [r["expected_share"] * 100 for r in rows], width=0.4,
           label="expected (weights)", color="#bbb")
    ax.set_ylabel("% of the rpc's calls")
    _provider_ticks(ax, rows)
    ax.legend(fontsize="small", title="red: flagged", title_fontsize="small")
    return fig


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


def _provider_ticks(ax: Any, rows: list[dict[str, Any]]) -> None:
    ax.set_xticks(range(len(rows)), [_plain(f"{r['provider']}\n{r['rpc']}") for r in rows],
                  fontsize=7, rotation=60, ha="right")


def _heatmap(per_provider: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    calls: dict[tuple[str, str], int] = {(r["rpc"], r["provider"]): r["calls"]
                                         for r in per_provider}
    if not calls:
        return None
    by_rpc, by_provider = defaultdict(int), defaultdict(int)
    for (rpc, provider), n in calls.items():
        by_rpc[rpc] += n
        by_provider[provider] += n
    rpcs = sorted(sorted(by_rpc, key=lambda k: -by_rpc[k])[:TOP])
    providers = sorted(sorted(by_provider, key=lambda k: -by_provider[k])[:TOP])
    grid = [[calls.get((rpc, p), 0) for p in providers] for rpc in rpcs]
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(providers) + 3),
                                    max(2.5, 0.4 * len(rpcs) + 1.5)))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(providers)), [_plain(p) for p in providers], rotation=60,
                  ha="right", fontsize=8)
    ax.set_yticks(range(len(rpcs)), [_plain(r) for r in rpcs], fontsize=8)
    fig.colorbar(image, ax=ax, label="calls")
    return fig


def _table(head: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>"
                      for row in rows) + "</table>")


def _span(per_provider: list[dict[str, Any]]) -> str:
    if not per_provider:
        return "The history is empty."
    first = min(r["first_window"] for r in per_provider)
    last = max(r["last_window"] for r in per_provider)
    calls = sum(r["calls"] for r in per_provider)
    return (f"History from {_when(first)} to {_when(last)}: {calls:,} attempts, "
            f"{len({r['provider'] for r in per_provider})} providers, "
            f"{len({r['rpc'] for r in per_provider})} rpcs.")


def _minutes_dt(t: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds == float("inf"):
        return "> 60 s"
    return f"{seconds * 1000:,.3g} ms"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.3g}%"
