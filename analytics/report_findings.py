"""The findings of ``rpcbus analyze`` in plain words, most severe first (for the report).

Each sentence gets a group and a severity: first what makes the history itself
doubtful (a node's clock off), then problems ranked by the calls they touched (a slow
provider's calls, failed calls over its peers' rate, calls a provider lost or took
against its share), then what is only worth knowing (hot rpcs, the busiest minutes),
then the weights that would change. Each cause is named once: a provider that took
more names the peers that lost the calls to it, a starved provider names the peers
that got its calls (they are not said apart), and a whole-span outlier lists its
episodes.
"""

from __future__ import annotations

import html
import time
from typing import Any

from rpcbus.analytics.findings import FAIR_TOLERANCE, failure_excess

DATA, PROBLEM, INFO, ADVICE = range(4)   # the groups, in the order they are said
STARVED_IDLE = 0.5     # a provider that took less and got no call in this share of its minutes


def findings(t: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The flagged findings of the tables (``clock_skew``, ``silent``, ``outliers``,
    ``episodes``, ``fairness``, ``hot_rpcs``, ``peak_minutes``, ``weights``), one
    sentence each (HTML-escaped), most severe first."""
    said: list[tuple[int, float, str]] = []
    said += _skew(t.get("clock_skew", []))
    said += _silent(t.get("silent", []))
    said += _slow_and_failing(t["outliers"], t.get("episodes", []))
    said += _fairness(t["fairness"])
    said += _hot_and_peaks(t["hot_rpcs"], t["peak_minutes"])
    said += _weights(t["weights"])
    if not [s for s in said if s[0] in (DATA, PROBLEM)]:
        said.append((DATA, 0, "Nothing stands out: no provider is unfairly loaded, slow or "
                              "failing against its peers, none went silent, and the nodes' "
                              "clocks agree."))
    return [text for _, _, text in sorted(said, key=lambda s: (s[0], -s[1]))]


_LEAP_BY = {"ends": "its rows ending that much after theirs",
            "load": "its load lining up with theirs once moved back",
            "ends+load": "its rows ending that much after theirs, its load lining up "
                         "with theirs once moved back"}


def _skew(rows: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    out = []
    for s in rows:
        if s.get("since") is not None:
            out.append((DATA, abs(s["offset_s"]),
                        f"<b>Clock leap:</b> node <b>{html.escape(s['node'])}</b>'s clock "
                        f"stepped {duration(abs(s['offset_s']))} ahead at "
                        f"{when(s['since'])} (a gap in its rows while the other nodes' "
                        f"went on, and {_LEAP_BY[s['method']]}): its rows from then on "
                        f"are read {duration(abs(s['offset_s']))} earlier, as if its "
                        f"clock had not stepped."))
            continue
        ahead = "ahead" if s["offset_s"] > 0 else "behind"
        against = ("the other nodes'" if s["relative_to"] == "the other nodes"
                   else f"{html.escape(s['relative_to'])}'s (one of the two is off)")
        how = {"ends": "its first and last rows", "load": "its load",
               "ends+load": "its first and last rows and its load"}[s["method"]]
        out.append((DATA, abs(s["offset_s"]),
                    f"<b>Clock skew:</b> node <b>{html.escape(s['node'])}</b> looks "
                    f"{duration(abs(s['offset_s']))} {ahead} ({how} sit that far from "
                    f"{against}): its rows are stamped by its own clock, so times, the "
                    f"span and per-minute figures mixing nodes are off by as much."))
    return out


def _silent(rows: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    e = html.escape
    out = []
    for s in rows:
        if s["kind"] == "node" and s.get("moved_to"):
            out.append((INFO, s["silent_s"],
                        f"<b>{e(s['name'])}</b>'s providers moved to node "
                        f"<b>{e(s['moved_to'])}</b> at {when(s['moved_at'])}: "
                        f"{e(s['name'])} wrote no history after {when(s['since'])} (renamed, "
                        f"or replaced under a new name); their figures go on under "
                        f"{e(s['moved_to'])}."))
        elif s["kind"] == "node":
            out.append((DATA, s["silent_s"] * 1000,
                        f"<b>Silent:</b> node <b>{e(s['name'])}</b> wrote no history after "
                        f"{when(s['since'])}, {duration(s['silent_s'])} before the other "
                        f"nodes stopped: it stopped, lost its disk or its history folder, or "
                        f"was cut off; its providers' figures end there."))
        else:
            out.append((PROBLEM, s["silent_s"],
                        f"<b>{e(s['name'])}</b> went silent on <b>{e(s['rpc'])}</b> "
                        f"(node {e(s['node'])}) after {when(s['since'])}: no row for "
                        f"{duration(s['silent_s'])} while its node and the rpc's other "
                        f"providers went on (it left, or hangs without answering)."))
    return out


def _slow_and_failing(outliers: list[dict[str, Any]],
                      episodes: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    e = html.escape
    out = []
    whole = {(o["rpc"], o["provider"], o["kind"]) for o in outliers}
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for ep in sorted(episodes, key=lambda ep: ep["start"]):
        by_key.setdefault((ep["rpc"], ep["provider"], ep["kind"]), []).append(ep)
    for o in outliers:
        eps = by_key.get((o["rpc"], o["provider"], o["kind"]), [])
        when = (" " + _episodes_said(eps) if eps else
                " No single stretch of minutes stands out (minute by minute it was only "
                "mildly off, or its peers had too few calls to compare): it holds over "
                "the span as a whole.")
        if o["kind"] == "slow":
            text = (f"<b>{e(o['provider'])}</b> is slow on <b>{e(o['rpc'])}</b>: p99 "
                    f"{ms(o['value'])} against a median of {ms(o['peers_median'])} for its "
                    f"{o['peers']} peer(s).{when}")
            severity = float(o["calls"])
        else:
            text = (f"<b>{e(o['provider'])}</b> is failing on <b>{e(o['rpc'])}</b>: "
                    f"{pct(o['value'])} of its calls failed or timed out, against "
                    f"{pct(o['peers_median'])} for its peers.{when}")
            severity = o["calls"] * max(0.0, o["value"] - o["peers_median"])
        out.append((PROBLEM, max([severity] + [ep["affected"] for ep in eps]), text))
    for key, eps in by_key.items():
        if key in whole:
            continue
        rpc, provider, kind = key
        what = "slow" if kind == "slow" else "failing"
        out.append((PROBLEM, sum(ep["affected"] for ep in eps),
                    f"<b>{e(provider)}</b> was {what} on <b>{e(rpc)}</b> for a while "
                    f"(not over the whole span): {_episodes_said(eps)}"))
    return out


def _episodes_said(eps: list[dict[str, Any]]) -> str:
    def one(ep: dict[str, Any]) -> str:
        if ep["kind"] == "slow":
            how = f"mean {ms(ep['value'])} against {ms(ep['peers_value'])} for its peers"
        else:
            how = f"{pct(ep['value'])} failed against {pct(ep['peers_value'])} for its peers"
        state = "still so at the end of the history" if ep["ongoing"] else "then recovered"
        return (f"{when(ep['start'])} to {when(ep['end'], clock_only=True)} "
                f"({ep['minutes']} min, {how}, {ep['calls']:,} calls; {state})")
    shown = sorted(eps, key=lambda ep: -ep["affected"])[:3]
    more = f"; and {len(eps) - 3} more (the episodes table)" if len(eps) > 3 else ""
    return ("In " + ("an episode" if len(eps) == 1 else f"{len(eps)} episodes") + ": "
            + "; ".join(one(ep) for ep in sorted(shown, key=lambda ep: ep["start"]))
            + more + ".")


def _fairness(fairness: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    e = html.escape
    out = []
    starved = {(f["rpc"], f["provider"]) for f in fairness if _starved(f)}
    gainers = _gained_from_starved(fairness, starved)
    for f in fairness:
        key = (f["rpc"], f["provider"])
        if not f["took"] or key in gainers or f.get("because_of") and key not in starved:
            continue
        moved = abs(f["calls"] - f["expected_calls"])
        share = (f"{pct(f['share'])} of the calls where its weight gives "
                 f"{pct(f['expected_share'])} ({f['calls']:,} calls, "
                 f"{f['expected_calls']:,.0f} expected)")
        if key in starved:
            went = sorted(p for r, p in gainers if r == f["rpc"])
            to = f" Its calls went to {e(', '.join(went))}." if went else ""
            out.append((PROBLEM, moved, f"<b>{e(f['provider'])}</b> is starved on "
                        f"<b>{e(f['rpc'])}</b>: no call in {f['idle_minutes']:,} of the "
                        f"{f['present_minutes']:,} minutes it was there; {share}.{to}"))
            continue
        lesser = sorted(g["provider"] for g in fairness
                        if g["rpc"] == f["rpc"] and g.get("among") == f.get("among")
                        and (g["rpc"], g["provider"]) not in starved
                        and f["provider"] in (g.get("because_of") or "").split(","))
        also = f" Its peers took less as a result: {e(', '.join(lesser))}." if lesser else ""
        among = (f" among the providers on {e(f['among'])} (policy local-first)"
                 if f.get("among") else "")
        out.append((PROBLEM, moved, f"<b>{e(f['provider'])}</b> took {f['took']} than its "
                    f"share of <b>{e(f['rpc'])}</b>{among}: {share}.{also}"))
    return out


def _gained_from_starved(fairness: list[dict[str, Any]],
                         starved: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The providers that took more only because a peer was starved: their share is no
    more than their expected share with the starved peers' lost share spread over the
    others by weight (and ``FAIR_TOLERANCE``). Said with the starved provider, not apart."""
    out = set()
    groups = {(f["rpc"], f.get("among")) for f in fairness
              if (f["rpc"], f["provider"]) in starved}
    for rpc, among in groups:
        mine = [f for f in fairness if f["rpc"] == rpc and f.get("among") == among]
        lost = [f for f in mine if (rpc, f["provider"]) in starved]
        expected = sum(f["expected_share"] or 0.0 for f in lost)
        taken = sum(f["share"] or 0.0 for f in lost)
        if expected >= 1:
            continue
        for f in mine:
            if f["took"] == "more" and (f["share"] or 0.0) <= (
                    (f["expected_share"] or 0.0) * (1 - taken) / (1 - expected)
                    * (1 + FAIR_TOLERANCE)):
                out.add((rpc, f["provider"]))
    return out


def _starved(f: dict[str, Any]) -> bool:
    return (f["took"] == "less" and bool(f.get("present_minutes"))
            and (f.get("idle_minutes") or 0) >= STARVED_IDLE * f["present_minutes"])


def _hot_and_peaks(hot: list[dict[str, Any]],
                   peaks: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    out = []
    for h in hot:
        if h["hot"]:
            out.append((INFO, h["calls"], f"<b>{html.escape(h['rpc'])}</b> is hot: "
                        f"{pct(h['share'])} of all calls ({h['calls_per_s']:,.1f} calls/s on "
                        f"average, {h['peak_minute_calls_per_s']:,.1f} in its busiest minute)."))
    top = sorted((p for p in peaks if p["rpc"] == "*"), key=lambda p: p["rank"])
    if top:
        out.append((INFO, -1, "Busiest minutes overall: " + "; ".join(
            f"{when(p['minute'])} ({p['calls_per_s']:,.1f} calls/s, p99 {ms(p['p99_s'])})"
            for p in top) + "."))
    return out


def _weights(weights: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    e = html.escape
    out = []
    for w in weights:
        current = w.get("current") or 1.0
        if abs(w["weight"] - current) < 0.05 * current:
            continue
        why = []
        if w["speed"] < 1:
            why.append(f"recent mean latency {ms(w['recent_latency_s'])} against "
                       f"{ms(w['peers_latency_s'])} for its peers")
        if failure_excess(w["recent_failure_rate"], w.get("peers_failure_rate")) > 0:
            why.append(f"recent failure rate {pct(w['recent_failure_rate'])} against "
                       f"{pct(w.get('peers_failure_rate') or 0.0)} for its peers")
        if not why:
            why.append("it recovered" if w.get("recovered_at") else
                       f"it serves as well as its peers now (recent mean latency "
                       f"{ms(w['recent_latency_s'])} against {ms(w['peers_latency_s'])})"
                       if w["weight"] > current else "its peers serve better now")
        out.append((ADVICE, abs(w["weight"] - current) * w["calls"],
                    f"Recommended weight {w['weight']:g} (now {in_use(w)}) for "
                    f"<b>{e(w['provider'])}</b> on <b>{e(w['rpc'])}</b>: {'; '.join(why)}."))
    return out


def in_use(w: dict[str, Any]) -> str:
    """The weight a provider has now, and since when when it changed in the span."""
    current = w.get("current") or 1.0
    if w.get("current_since") is None:
        return f"{current:g}"
    return f"{current:g}, set at {when(w['current_since'])}; {w['previous']:g} before"


def when(t: float, clock_only: bool = False) -> str:
    return time.strftime("%H:%M UTC" if clock_only else "%Y-%m-%d %H:%M UTC", time.gmtime(t))


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds == float("inf"):
        return "> 60 s"
    return f"{seconds * 1000:,.3g} ms"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.3g}%"
