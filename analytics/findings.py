"""What ``rpcbus analyze`` concludes from the history: the span-wide ``per_provider`` table,
fairness, outliers, episodes (analytics/episodes.py), hot rpcs, peak minutes,
recommended weights and clock skew (analytics/skew.py); docs/history.md has every rule
in words. Pure: numpy over the rollup on the driver (analytics/series.py), no Spark.

- ``fairness``: per rpc and provider, the calls it got against the calls its weight
  should have given it. Minute by minute, a provider present (from its first to its last
  minute with any row for the rpc; exactly the minutes with a row on a node that writes
  presence rows, and there for the part of the minute its windows span) expects a share
  of the rpc's calls of that minute: the part of the minute it was there times its
  weight over its own and the others' weights, each times the part it was there (the
  shares scaled to add up to the minute's calls); summed over the span that is
  ``expected_calls`` (``present_s``: the seconds it was there). A provider connected 20
  s of a minute expects a third of a whole minute's share, not all of it. ``ratio`` =
  calls / expected; per rpc the spread of the ratios: ``cv`` (standard deviation over
  mean) and ``max_over_mean``. Flagged (``took`` "more" or "less") when the ratio is off
  by more than ``FAIR_TOLERANCE`` and by more than ``FAIR_Z`` standard deviations of a
  weighted random choice. A provider that took less while others of its rpc took more
  names them (``because_of``): the report names the cause once. ``present_minutes`` /
  ``idle_minutes`` show starvation. Under the ``local-first`` policy (any row of the rpc
  says so) the providers of each serving node are judged among themselves (``among``:
  the node; null under ``cluster``): that policy keeps calls on the caller's node, so
  how calls split between nodes follows where the callers are, not the weights; and it
  sends a slow or failing provider less by design, so one the outliers name is judged
  alone (never flagged).
- ``outliers``: a provider whose p99 is over ``SLOW_FACTOR`` times the median p99 of
  the rpc's other providers (``kind`` "slow"), or whose failure rate (errors and
  timeouts over calls) is at least ``FAIL_MARGIN`` above and ``FAIL_FACTOR`` times
  the others' median (``kind`` "failing").
- ``hot_rpcs``: every rpc ranked by calls, with its share and its busiest minute;
  ``hot`` when its share is over an even share and at least ``HOT_FACTOR`` times the
  median share of the other rpcs (with two rpcs at 97 % / 3 % the first is hot; an
  even share alone never fires with two rpcs). An rpc alone is never hot.
- ``peak_minutes``: the ``PEAKS`` busiest minutes (by rate: a partial minute counts its
  real span) of each rpc, and of all rpcs together (rpc ``*``).
- ``weights``: a recommended weight per rpc and provider, from the recent state (each
  minute counts ``0.5 ** (age / half_life)``, age from the newest minute of the
  provider's serving nodes; the minutes up to an episode that ended ``RECOVERED``
  minutes before no longer count, nor those before an episode still going): the score
  ``(1 - excess failure rate) ** 4 * min(1, LATENCY_BAND * others' median mean latency
  / own mean latency)`` (excess: over the others' median and ``FAILURE_NOISE``) over the
  best score of the rpc's providers (the best weighs 1), at least ``MIN_WEIGHT``,
  rounded to 3 decimals. ``weights.json`` is what ``rpc.weights_file`` loads
  (broker/weights.py).
- ``clock_skew``: nodes whose clocks look off, or stepped (``since``: when; their rows
  are moved back from then on before anything here is judged) (analytics/skew.py).
- ``silent``: nodes and providers that stopped being seen while the rest went on
  (analytics/silence.py).

Every table is a list of dicts of plain Python values (None for null), the columns of
``SCHEMAS`` (the Parquet tables' Spark DDL).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rpcbus.analytics import episodes as episodes_mod
from rpcbus.analytics import silence, skew
from rpcbus.analytics.rollup import COUNTS, QUANTILE_COLUMNS, QUANTILES
from rpcbus.analytics.series import Merged, Series, failed, merge, others_median, quantiles, ratio

FAIR_TOLERANCE = 0.10   # |ratio - 1| above this ...
FAIR_Z = 4.0            # ... and |calls - expected| above this many sqrt(expected)
SLOW_FACTOR = 3.0
FAIL_MARGIN = 0.05
FAIL_FACTOR = 3.0
PEAKS = 3
HOT_FACTOR = 3.0
MIN_WEIGHT = 0.05
FAILURE_POWER = 4
LATENCY_BAND = 2.0   # a mean latency up to this many times the peers' does not lower a weight
FAILURE_NOISE = 0.01  # nor does a failure rate up to this much over the peers' median
RECOVERED = 10       # minutes after an episode ended: its minutes no longer weigh

_FIGURES = ", ".join(
    [*(f"{c} BIGINT" for c in COUNTS),
     *(f"{c}_rate DOUBLE" for c in ("error", "reject", "timeout", "failure")),
     "peak_in_flight BIGINT, latency_sampled BIGINT, latency_sum_s DOUBLE, "
     "latency_min_s DOUBLE, latency_max_s DOUBLE, latency_mean_s DOUBLE",
     *(f"{c} DOUBLE" for c in QUANTILE_COLUMNS),
     "bytes_in BIGINT, bytes_out BIGINT, weight DOUBLE, first_window DOUBLE, "
     "last_window DOUBLE"])
SCHEMAS = {
    "per_provider": f"rpc STRING, provider STRING, {_FIGURES}, served_by STRING",
    "fairness": "rpc STRING, provider STRING, calls BIGINT, rpc_calls BIGINT, "
                "expected_calls DOUBLE, share DOUBLE, expected_share DOUBLE, ratio DOUBLE, "
                "weight DOUBLE, providers BIGINT, cv DOUBLE, max_over_mean DOUBLE, "
                "present_minutes BIGINT, present_s DOUBLE, idle_minutes BIGINT, took STRING, "
                "because_of STRING, among STRING",
    "outliers": "rpc STRING, provider STRING, calls BIGINT, peers BIGINT, kind STRING, "
                "value DOUBLE, peers_median DOUBLE",
    "episodes": episodes_mod.SCHEMA,
    "hot_rpcs": f"rpc STRING, {_FIGURES}, providers BIGINT, peak_minute_calls BIGINT, "
                "peak_minute_calls_per_s DOUBLE, share DOUBLE, rpcs BIGINT, "
                "others_median_share DOUBLE, hot BOOLEAN, calls_per_s DOUBLE, rank INT",
    "peak_minutes": "rpc STRING, rank INT, minute BIGINT, calls BIGINT, calls_per_s DOUBLE, "
                    "failure_rate DOUBLE, p50_s DOUBLE, p99_s DOUBLE",
    "weights": "rpc STRING, provider STRING, calls BIGINT, recent_failure_rate DOUBLE, "
               "peers_failure_rate DOUBLE, recent_latency_s DOUBLE, peers_latency_s DOUBLE, "
               "speed DOUBLE, score DOUBLE, weight DOUBLE, current DOUBLE, "
               "current_since BIGINT, previous DOUBLE, recovered_at BIGINT",
    "clock_skew": "node STRING, offset_s DOUBLE, method STRING, relative_to STRING, "
                  "correlation DOUBLE, first_window DOUBLE, last_window DOUBLE, since DOUBLE",
    "silent": silence.SCHEMA,
}


@dataclass
class Rpc:
    """One rpc on a grid: its providers (sorted) x its minutes (every minute with a row),
    ``grid``: per cell the sums over serving nodes (``calls``, ``failed``, ``lat_sum``,
    ``sampled``, ``weight_sum``, ``nrows``, ``local_first``: rows of nodes under that
    policy), ``has`` (a row that minute, 1/0) and ``span`` (the seconds from its first
    window's start to its last window's end in that minute, at most 60);
    ``totals``: per provider, everything over the span; ``by_minute``: everything per
    minute over the providers; ``exact``: per provider, served by a node that writes
    presence rows; ``served_by``: per provider, its serving nodes; ``newest``: per
    provider, the newest minute of its serving nodes' own timelines (a node whose clock
    is ahead, or one that went silent, moves no other provider's "now")."""

    name: str
    providers: list[str]
    minutes: np.ndarray
    grid: dict[str, np.ndarray]
    totals: list[Merged]
    by_minute: Merged
    exact: np.ndarray
    served_by: list[list[str]]
    newest: np.ndarray


def arrange(series: list[Series]) -> Rpc:
    """One rpc's series (the rollup's, every one of that rpc) on its grid (``Rpc``);
    ``exact`` is set by ``tables``, which knows every node."""
    grouped: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        grouped[s.provider].append(s)
    providers = sorted(grouped)
    mine = [grouped[p] for p in providers]
    by_minute = merge(series)
    grid = {c: np.zeros((len(providers), len(by_minute.minutes)))
            for c in ("calls", "failed", "lat_sum", "sampled", "weight_sum", "nrows",
                      "local_first", "has", "span")}
    for i, group in enumerate(mine):
        own = merge(group)
        at = np.searchsorted(by_minute.minutes, own.minutes)
        for c, values in (("calls", own.cols["calls"]), ("failed", failed(own.cols)),
                          ("lat_sum", own.cols["latency_sum_s"]),
                          ("sampled", own.cols["latency_sampled"]),
                          ("weight_sum", own.cols["weight_sum"]),
                          ("nrows", own.cols["nrows"]),
                          ("local_first", own.cols["local_first"]), ("has", 1.0),
                          ("span", np.clip(own.cols["window_end"] - own.cols["window_start"],
                                           0.0, 60.0))):
            grid[c][i, at] = values
    return Rpc(series[0].rpc, providers, by_minute.minutes, grid,
               [merge(group, by_minute=False) for group in mine], by_minute,
               np.zeros(len(providers), bool), [sorted({s.served_by for s in g}) for g in mine],
               np.zeros(len(providers), np.int64))


def tables(arranged: list[Rpc], nodes: dict[str, Merged], recording: set[str],
           half_life: float, newest: int, span: tuple[float, float],
           leaps: Sequence[dict[str, Any]] = ()) -> dict[str, list[dict[str, Any]]]:
    """Every findings table (and ``per_provider``) from the rpcs (``arrange``, any order),
    the series merged per serving node (``series.per_node``), the serving nodes that
    write presence rows (``series.presence``), the ``newest`` minute (the weights' decay
    counts back from it), the history's ``span`` (first window start, last window end:
    partial minutes' rates) and the clocks that stepped (analytics/skew.py ``leaps``:
    the rows are already moved back; they are said in ``clock_skew``)."""
    # A node that records presence writes a row (no calls, peak_in_flight 0) per window
    # for every provider connected to it: its providers are present exactly in the minutes
    # they have a row. Elsewhere (older nodes), from the first to the last minute with one.
    own = {n: int(np.nanmax(m.cols["window_end"]) - 1) // 60 * 60 for n, m in nodes.items()}
    arranged = [replace(r, exact=np.array([any(n in recording for n in nodes_)
                                           for nodes_ in r.served_by], bool),
                        newest=np.array([max((own[n] for n in nodes_ if n in own),
                                             default=newest) for nodes_ in r.served_by],
                                        np.int64))
                for r in sorted(arranged, key=lambda r: r.name)]
    per_provider = [{"rpc": r.name, "provider": p, **figures(t)[0],
                     "served_by": ",".join(r.served_by[i])}
                    for r in arranged for i, (p, t) in enumerate(zip(r.providers, r.totals,
                                                                     strict=True))]
    found = episodes_mod.episodes(arranged)
    odd = outliers(per_provider)
    skewed = clock_skew(nodes)
    offsets = {f["node"]: f["offset_s"] for f in skewed}
    skewed = [*(_stepped(leap, nodes) for leap in leaps), *skewed]
    made = {"per_provider": per_provider,
            "fairness": fairness(arranged, {(x["rpc"], x["provider"]) for x in odd}),
            "outliers": odd, "episodes": found,
            "hot_rpcs": hot_rpcs(arranged, span), "peak_minutes": peak_minutes(arranged, span),
            "weights": weights(arranged, half_life, found),
            "clock_skew": skewed,
            "silent": silence.nodes({n: (float(np.nanmin(m.cols["window_start"])),
                                         float(np.nanmax(m.cols["window_end"])))
                                     for n, m in nodes.items()}, offsets,
                                    silence.named(arranged))
            + silence.providers(arranged)}
    return {name: typed(rows, SCHEMAS[name]) for name, rows in made.items()}


def typed(rows: list[dict[str, Any]], ddl: str) -> list[dict[str, Any]]:
    """``rows`` with exactly the columns of ``ddl`` (Spark DDL), in its order, as plain
    Python values of its types: NaN becomes None (null), numpy numbers Python's."""
    cast = {"BIGINT": int, "INT": int, "DOUBLE": float, "BOOLEAN": bool, "STRING": str}
    columns = [(name, cast[kind]) for name, kind in (c.split() for c in ddl.split(", "))]

    def value(x: Any, to: Any) -> Any:
        if x is None or (isinstance(x, float | np.floating) and x != x):
            return None
        return to(x)
    return [{name: value(r[name], to) for name, to in columns} for r in rows]


def figures(m: Merged) -> list[dict[str, Any]]:
    """Per minute of ``m``: what people read from a rollup (counts, rates, mean latency,
    interpolated percentiles: series.py ``quantiles``, the mean weight, first and last
    window), a dict per minute."""
    columns = figure_columns(m.cols, m.buckets)
    names = list(columns)
    return [dict(zip(names, row, strict=True))
            for row in zip(*(columns[n].tolist() for n in names), strict=True)]


def figure_columns(c: dict[str, np.ndarray], buckets: np.ndarray) -> dict[str, np.ndarray]:
    """``figures`` as columns: per row of the sums ``c`` and histograms ``buckets``
    (NaN where a figure has no value: a rate of no calls, a latency never sampled)."""
    lo, hi = c["latency_min_s"], c["latency_max_s"]
    qs = quantiles(buckets, lo, hi, QUANTILES)
    columns = {k: c[k] for k in COUNTS}
    columns.update({"error_rate": ratio(c["errors"], c["calls"]),
                    "reject_rate": ratio(c["rejected"], c["calls"]),
                    "timeout_rate": ratio(c["ack_timeouts"] + c["response_timeouts"],
                                          c["calls"]),
                    "failure_rate": ratio(failed(c), c["calls"]),
                    "peak_in_flight": c["peak_in_flight"],
                    "latency_sampled": c["latency_sampled"], "latency_sum_s": c["latency_sum_s"],
                    "latency_min_s": lo, "latency_max_s": hi,
                    "latency_mean_s": ratio(c["latency_sum_s"], c["latency_sampled"]),
                    **{name: qs[q] for name, q in zip(QUANTILE_COLUMNS, QUANTILES, strict=True)},
                    "bytes_in": c["bytes_in"], "bytes_out": c["bytes_out"],
                    "weight": ratio(c["weight_sum"], c["nrows"]),
                    "first_window": c["window_start"], "last_window": c["window_end"]})
    return columns


def calls_per_s(minutes: np.ndarray, calls: np.ndarray, seconds: float,
                span: tuple[float, float]) -> np.ndarray:
    """Calls per second of the periods starting at ``minutes``: over the seconds of each
    period inside ``span`` (NaN where none is)."""
    inside = np.maximum(0.0, np.minimum(minutes + seconds, span[1]) - np.maximum(minutes,
                                                                               span[0]))
    return ratio(calls, inside)


def fairness(arranged: list[Rpc], odd: AbstractSet[tuple[str, str]] = frozenset()
             ) -> list[dict[str, Any]]:
    """Per rpc: every provider against the others (policy ``cluster``); where any of its
    rows came from a node whose policy is ``local-first``, each serving node's providers
    against each other (``among``: the node): that policy keeps calls on their node, so
    shares between nodes follow where the callers are, while within a node the choice
    still follows the weights among providers as quick. It sends a slow or failing
    provider less by design: one of ``odd`` (the outliers' (rpc, provider)) is judged
    alone (never flagged), its node's others among themselves."""
    out = []
    for r in arranged:
        if r.grid["local_first"].sum() > 0:
            groups: dict[str, list[int]] = defaultdict(list)
            for i, nodes in enumerate(r.served_by):
                apart = (r.name, r.providers[i]) in odd
                groups[",".join(nodes) + ("\0" + r.providers[i] if apart else "")].append(i)
            for key, idx in sorted(groups.items()):
                out += _judged(r, np.array(idx), key.split("\0")[0])
        else:
            out += _judged(r, np.arange(len(r.providers)), None)
    return out


def _judged(r: Rpc, idx: np.ndarray, among: str | None) -> list[dict[str, Any]]:
    """The fairness rows of ``r``'s providers ``idx``, judged against each other."""
    g = {c: v[idx] for c, v in r.grid.items()}
    exact = r.exact[idx]
    has = g["has"] > 0
    w = ratio(g["weight_sum"], g["nrows"])
    columns = np.arange(len(r.minutes))
    first = np.argmax(has, axis=1)
    last = len(r.minutes) - 1 - np.argmax(has[:, ::-1], axis=1)
    w_avg = np.nanmean(np.where(has, w, np.nan), axis=1)
    present = ((columns[None, :] >= first[:, None]) & (columns[None, :] <= last[:, None])
               & (~exact[:, None] | has))
    weight = np.where(present, np.where(has, w, w_avg[:, None]), 0.0)
    # the part of the minute each was there: its span over the longest of the minute's
    # (a history's partial first minute is whole for all); 1 where presence is not
    # recorded. In the seconds it is there it expects its weight over its own and the
    # others' weights, each as present as it was; the minute's calls are shared out so.
    with np.errstate(invalid="ignore"):
        longest = np.nanmax(np.where(has, g["span"], np.nan), axis=0)
    there = np.where(has & exact[:, None], np.clip(ratio(g["span"], longest[None, :]),
                                                   0.0, 1.0), 1.0)
    there = np.where(np.isnan(there), 1.0, there)
    others = (weight * there).sum(axis=0)[None, :] - weight * there
    raw = np.where(present, there * ratio(weight, weight + others), 0.0)
    raw = np.where(np.isnan(raw), 0.0, raw)
    expected_cells = np.where(present, ratio(g["calls"].sum(axis=0), raw.sum(axis=0))
                              [None, :] * raw, np.nan)
    counted = ~np.isnan(expected_cells)
    expected = np.where(counted.any(axis=1), np.nansum(expected_cells, axis=1), np.nan)
    calls = g["calls"].sum(axis=1)
    total = calls.sum()
    ratios = ratio(calls, expected)
    kept = ratios[~np.isnan(ratios)]
    mean = float(kept.mean()) if len(kept) else math.nan
    spread = float(kept.std()) / mean if len(kept) and mean else math.nan
    top = float(kept.max()) / mean if len(kept) and mean else math.nan
    rows = []
    for j, i in enumerate(idx):
        e, q = float(expected[j]), float(ratios[j])
        flagged = (abs(q - 1) > FAIR_TOLERANCE and abs(calls[j] - e) > FAIR_Z * math.sqrt(e)
                   if q == q else False)
        rows.append({"rpc": r.name, "provider": r.providers[i], "calls": calls[j],
                     "rpc_calls": total, "expected_calls": e, "share": _div(calls[j], total),
                     "expected_share": _div(e, total), "ratio": q,
                     "weight": float(w_avg[j]), "providers": len(idx), "cv": spread,
                     "max_over_mean": top, "among": among,
                     "present_minutes": int(present[j].sum()),
                     "present_s": float((there[j] * present[j] * 60).sum()),
                     "idle_minutes": int((present[j] & (g["calls"][j] == 0)).sum()),
                     "took": ("more" if q > 1 else "less") if flagged else None})
    # A provider that took less while another of the rpc took more lost its calls to
    # it: the cause is named once (``because_of``: the providers that took more).
    more = ",".join(x["provider"] for x in rows if x["took"] == "more") or None
    for x in rows:
        x["because_of"] = more if x["took"] == "less" else None
    return rows


def outliers(per_provider: list[dict[str, Any]]) -> list[dict[str, Any]]:
    mine: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in per_provider:
        mine[x["rpc"]].append(x)
    out = []
    for rpc, rows in mine.items():
        if len(rows) < 2:
            continue
        p99 = _others(rows, "p99_s")
        fails = _others(rows, "failure_rate")
        for x, peers_p99, peers_fail in zip(rows, p99, fails, strict=True):
            base = {"rpc": rpc, "provider": x["provider"], "calls": x["calls"],
                    "peers": len(rows) - 1}
            if peers_p99 > 0 and _gt(x["p99_s"], SLOW_FACTOR * peers_p99):
                out.append({**base, "kind": "slow", "value": x["p99_s"],
                            "peers_median": peers_p99})
            if _ge(x["failure_rate"], peers_fail + FAIL_MARGIN) and _ge(
                    x["failure_rate"], FAIL_FACTOR * peers_fail):
                out.append({**base, "kind": "failing", "value": x["failure_rate"],
                            "peers_median": peers_fail})
    return out


def hot_rpcs(arranged: list[Rpc], span: tuple[float, float]) -> list[dict[str, Any]]:
    rows = []
    for r in arranged:
        minutes, counts = r.by_minute.minutes, r.by_minute.cols["calls"]
        per_s = calls_per_s(minutes, counts, 60, span)
        whole = figures(merge(r.totals, by_minute=False))[0]
        # the busiest minute, as peak_minutes ranks them: by rate (a partial first or last
        # minute by its real span), then calls, then the earlier; both columns are its own
        busiest = np.lexsort((minutes, -counts, -np.nan_to_num(per_s, nan=-np.inf)))[0] \
            if len(minutes) and not np.all(np.isnan(per_s)) else None
        rows.append({"rpc": r.name, **whole, "providers": len(r.providers),
                     "peak_minute_calls": int(counts[busiest]) if busiest is not None
                     else None,
                     "peak_minute_calls_per_s": float(per_s[busiest]) if busiest is not None
                     else None})
    total = sum(x["calls"] for x in rows)
    for x in rows:
        x["share"] = _div(x["calls"], total)
        x["rpcs"] = len(rows)
    for x, other in zip(rows, _others(rows, "share"), strict=True):
        x["others_median_share"] = other
        x["hot"] = _gt(x["share"], 1.0 / len(rows)) and _ge(x["share"], HOT_FACTOR * other)
        x["calls_per_s"] = _div(x["calls"], x["last_window"] - x["first_window"])
    for rank, x in enumerate(sorted(rows, key=lambda x: (-x["calls"], x["rpc"])), 1):
        x["rank"] = rank
    return rows


def peak_minutes(arranged: list[Rpc], span: tuple[float, float]) -> list[dict[str, Any]]:
    """The busiest minutes by rate (a partial first or last minute counts its real span)."""
    out = []
    everything = [("*", merge([r.by_minute for r in arranged]))]
    for name, m in [(r.name, r.by_minute) for r in arranged] + everything:
        per_s = calls_per_s(m.minutes, m.cols["calls"], 60, span)
        order = sorted(range(len(m.minutes)), key=lambda i: (
            math.isnan(per_s[i]), -_nan0(per_s[i]), -m.cols["calls"][i], m.minutes[i]))
        top = order[:PEAKS]
        picked = Merged(m.minutes[top], {c: v[top] for c, v in m.cols.items()},
                        m.buckets[top])
        for rank, (i, f) in enumerate(zip(top, figures(picked), strict=True), 1):
            out.append({"rpc": name, "rank": rank, "minute": m.minutes[i],
                        "calls": m.cols["calls"][i], "calls_per_s": float(per_s[i]),
                        "failure_rate": f["failure_rate"], "p50_s": f["p50_s"],
                        "p99_s": f["p99_s"]})
    return out


def weights(arranged: list[Rpc], half_life: float,
            found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recommended weights from the recent state, each provider's "now" its serving
    nodes' newest minute (``Rpc.newest``): minutes decay with ``half_life``; the minutes
    up to the end of an episode (``found``) that ended ``RECOVERED`` minutes or more
    before now no longer count (the provider recovered), nor those before an episode
    still going (its state is the episode's); a mean latency within ``LATENCY_BAND``
    times the peers' does not lower the weight (a difference inside the histogram's
    resolution is noise). ``current`` is the weight in use in the provider's newest
    minute; ``current_since`` the minute it took that weight, and ``previous`` the one
    before, when it changed within the span."""
    newest = {(r.name, p): int(r.newest[i]) for r in arranged
              for i, p in enumerate(r.providers)}
    healed: dict[tuple[str, str], int] = {}    # recovered: its minutes up to here
    cut: dict[tuple[str, str], int] = {}       # the minutes that count start here
    for ep in found:
        key = (ep["rpc"], ep["provider"])
        if ep["ongoing"]:
            cut[key] = max(cut.get(key, ep["start"]), ep["start"])
        elif ep["end"] - 60 <= newest[key] - 60 * RECOVERED:
            healed[key] = max(healed.get(key, ep["end"]), ep["end"])
            cut[key] = max(cut.get(key, ep["end"]), ep["end"])
    out = []
    for r in arranged:
        g = r.grid
        since = np.array([cut.get((r.name, p), -math.inf) for p in r.providers])
        kept = (g["has"] > 0) & (r.minutes[None, :] >= since[:, None])
        age = (r.newest[:, None] - r.minutes[None, :]) / half_life
        decay = np.where(kept, 0.5 ** np.maximum(age, 0.0), 0.0)
        fail = ratio((decay * g["failed"]).sum(1), (decay * g["calls"]).sum(1))
        latency = ratio((decay * g["lat_sum"]).sum(1), (decay * g["sampled"]).sum(1))
        peers_latency, _ = others_median(latency[:, None])
        peers_fail, _ = others_median(fail[:, None])
        rows = []
        for i, p in enumerate(r.providers):
            if not kept[i].any():
                continue
            lat, peers_lat = float(latency[i]), float(peers_latency[i, 0])
            excess = failure_excess(fail[i], peers_fail[i, 0])
            speed = (min(1.0, LATENCY_BAND * peers_lat / lat)
                     if lat > 0 and peers_lat == peers_lat else 1.0)
            rows.append({"rpc": r.name, "provider": p, "calls": g["calls"][i][kept[i]].sum(),
                         "recent_failure_rate": float(fail[i]),
                         "peers_failure_rate": float(peers_fail[i, 0]),
                         "recent_latency_s": lat, "peers_latency_s": peers_lat, "speed": speed,
                         "score": (1.0 - excess) ** FAILURE_POWER * speed,
                         **_in_use(r, i), "recovered_at": healed.get((r.name, p))})
        best = max((x["score"] for x in rows), default=0.0)
        for x in rows:   # rounded half up, as Spark's round
            x["weight"] = max(MIN_WEIGHT, math.floor(x["score"] / best * 1000 + 0.5) / 1000
                              if best > 0 else 0.0)
        out += rows
    return out


def _in_use(r: Rpc, i: int) -> dict[str, Any]:
    """The weight provider ``i`` had in its newest minute with a row, since when (the
    first minute not at the weight before, a minute mixing the two included) and the
    weight before it."""
    at = np.flatnonzero(r.grid["nrows"][i] > 0)
    if not len(at):
        return {"current": math.nan, "current_since": None, "previous": math.nan}
    w = np.round(r.grid["weight_sum"][i, at] / r.grid["nrows"][i, at], 3)
    changed = np.flatnonzero(w != w[-1])
    if not len(changed):
        return {"current": float(w[-1]), "current_since": None, "previous": math.nan}
    k, since = int(changed[-1]), int(changed[-1]) + 1
    while k > 0 and min(w[k - 1], w[-1]) < w[k] < max(w[k - 1], w[-1]):
        since, k = k, k - 1    # a minute of rows at both weights: the change began there
    return {"current": float(w[-1]), "current_since": int(r.minutes[at[since]]),
            "previous": float(w[k])}


def clock_skew(nodes: dict[str, Merged]) -> list[dict[str, Any]]:
    """The ``clock_skew`` rows (analytics/skew.py) from each serving node's calls per
    minute and its first and last window (``series.per_node``)."""
    seen = {}
    for node, m in nodes.items():
        seen[node] = {"first": float(np.nanmin(m.cols["window_start"])),
                      "last": float(np.nanmax(m.cols["window_end"])),
                      "calls": dict(zip(m.minutes.astype(int).tolist(),
                                        m.cols["calls"].tolist(), strict=True))}
    return [{"node": f["node"], "offset_s": f["offset_s"], "method": f["method"],
             "relative_to": f["relative_to"], "correlation": f["correlation"],
             "first_window": seen[f["node"]]["first"], "last_window": seen[f["node"]]["last"],
             "since": None}
            for f in skew.find(seen)]


def _stepped(leap: dict[str, Any], nodes: dict[str, Merged]) -> dict[str, Any]:
    """A ``clock_skew`` row for a clock that stepped (analytics/skew.py ``leaps``): its
    node's first and last window are those of its rows moved back."""
    m = nodes.get(leap["node"])
    return {**{k: leap[k] for k in ("node", "offset_s", "method", "relative_to",
                                    "correlation", "since")},
            "first_window": float(np.nanmin(m.cols["window_start"])) if m else None,
            "last_window": float(np.nanmax(m.cols["window_end"])) if m else None}


def throughput(nodes: dict[str, Merged],
               span: tuple[float, float]) -> dict[str, dict[int, float]]:
    """Per serving node (``series.per_node``), its calls per second minute by minute (the
    report's chart: the ``per_minute`` table's ``calls_per_s`` added up per node)."""
    out = {}
    for node, m in nodes.items():
        per_s = calls_per_s(m.minutes, m.cols["calls"], 60, span)
        out[node] = {int(t): (0.0 if v != v else v)
                     for t, v in zip(m.minutes.tolist(), per_s.tolist(), strict=True)}
    return out


def weights_doc(table: list[dict[str, Any]], source: dict[str, Any]) -> dict[str, Any]:
    """The ``weights`` table as the document nodes load (``rpc.weights_file``)."""
    rpcs_: dict[str, dict[str, float]] = {}
    for r in table:
        rpcs_.setdefault(r["rpc"], {})[r["provider"]] = r["weight"]
    return {"schema_version": 1,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": source, "default": 1.0,
            "rpcs": {rpc: dict(sorted(named.items())) for rpc, named in sorted(rpcs_.items())}}


def _others(rows: list[dict[str, Any]], column: str) -> list[float]:
    """Per row, the median of ``column`` over the other rows (NaN: none has a value)."""
    values = np.array([[_nan(x[column])] for x in rows])
    medians: list[float] = others_median(values)[0][:, 0].tolist()
    return medians


def _nan(x: Any) -> float:
    return math.nan if x is None else float(x)


def failure_excess(rate: Any, peers: Any) -> float:
    """The part of a failure rate that lowers a weight: over the peers' rate (what every
    provider of the rpc fails is no reason to move calls) by more than FAILURE_NOISE
    (nor is noise); 0.0 otherwise, and where a rate is unknown (None or NaN)."""
    return max(0.0, _nan0(rate) - _nan0(peers) - FAILURE_NOISE)


def _nan0(x: Any) -> float:
    return 0.0 if x is None or x != x else float(x)


def _div(a: Any, b: Any) -> float:
    return float(a) / float(b) if b else math.nan


def _gt(a: Any, b: float) -> bool:
    return a is not None and a == a and b == b and a > b


def _ge(a: Any, b: float) -> bool:
    return a is not None and a == a and b == b and a >= b
