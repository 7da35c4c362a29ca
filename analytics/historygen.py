"""``rpcbus history-gen``: a realistic synthetic load history, for tests and scale runs.

Writes the same rows, files and partitions as the nodes (broker/history.py,
docs/history.md): N nodes, M providers spread over them, K rpcs each provided
by a few providers, windows over a time span; load follows a daily curve with
noise and cluster-wide minute-to-minute bursts (every node sees them at once);
providers named in ``slow`` answer ~10x slower, those in ``failing`` fail ~20% of
their calls (``NAME@A-B``: only from minute A to minute B), those in ``hogs`` get
twice their share (as if the choice were unfair), those in ``starved`` stay connected
but get no call after their first minute. Like the nodes, a provider with no call in
a window gets a presence row. A node in ``skew`` stamps its rows with a clock that
many seconds off (``(seconds, minute)``: from that minute on, a clock that stepped;
a number: throughout). With ``policy`` "local-first" the rows say so, the nodes' callers are
uneven (node i makes i times the first's calls), each node's calls go to the
providers on it when it has any (as that policy does below its spill point), and a
slow provider gets a tenth of its share (that policy's choice weighs time taken).
Deterministic for a given ``seed``.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from typing import Any

from rpcbus.schema import BOUNDS, bucket_of
from rpcbus.schema import HISTORY_SCHEMA_VERSION as SCHEMA_VERSION


def generate(out: str, nodes: int = 3, providers: int = 6, rpcs: int = 4, hours: float = 1.0,
             window: float = 10.0, start: float | None = None, slow: tuple[str, ...] = (),
             failing: tuple[str, ...] = (), hogs: tuple[str, ...] = (), seed: int = 1,
             rate: float = 50.0, starved: tuple[str, ...] = (),
             skew: dict[str, float | tuple[float, float]] | None = None,
             policy: str = "cluster") -> int:
    """Write the history under ``out``; returns the number of rows."""
    rng = random.Random(seed)
    slow_at, failing_at = _spans(slow), _spans(failing)
    clocks = {n: v if isinstance(v, tuple) else (v, 0.0) for n, v in (skew or {}).items()}
    start = start if start is not None else 1_793_000_000.0    # 2026-10-27, a fixed instant
    start -= start % window
    node_names = [f"n{i + 1}" for i in range(nodes)]
    provider_names = [f"p{i + 1}" for i in range(providers)]
    home = {p: node_names[i % nodes] for i, p in enumerate(provider_names)}
    rpc_names = [f"svc{i + 1}.call" for i in range(rpcs)]
    serving = {r: rng.sample(provider_names, min(len(provider_names), rng.randint(2, 3)))
               for r in rpc_names}
    named = [n.partition("@")[0] for n in (*slow, *failing)] + [*hogs, *starved]
    unknown = sorted(set(named) - set(provider_names))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: no such provider (this history has "
                         f"p1 to p{providers})")
    for name in dict.fromkeys(named):  # a provider named for a fault serves: it shows
        if not any(name in provs for provs in serving.values()):
            serving[rpc_names[provider_names.index(name) % len(rpc_names)]].append(name)
    files: dict[str, Any] = {}
    rows = 0
    burst = 1.0
    try:
        for w in range(int(hours * 3600 / window)):
            t = start + w * window
            minute = int((t - start) // 60)
            if (t - start) % 60 < window:      # a new minute: the cluster's load moves
                burst = rng.lognormvariate(0.0, 0.4)
            daily = 1.0 + 0.5 * math.sin(2 * math.pi * (t % 86400) / 86400)
            for rpc, provs in serving.items():
                calls_of = _split(rng, provs, node_names, rate * daily * burst * window
                                  / nodes, hogs, starved if minute > 0 else (),
                                  home if policy == "local-first" else None,
                                  {p for p in provs if _within(slow_at.get(p), minute)})
                for prov in provs:
                    served = home[prov]
                    offset, since = clocks.get(served, (0.0, 0.0))
                    stamp = t + offset if minute >= since else t
                    worked = [_row(rng, stamp, window, rpc, prov, served, routed_by, calls,
                                   _within(slow_at.get(prov), minute),
                                   _within(failing_at.get(prov), minute))
                              for routed_by in node_names
                              if (calls := calls_of[(prov, routed_by)])]
                    peak = sum(r["peak_in_flight"] for r in worked)   # as if they coincided
                    for row in worked:
                        row["provider_peak_in_flight"] = peak
                        row["policy"] = policy
                        _file(files, out, served, stamp).write(
                            json.dumps(row, separators=(",", ":")) + "\n")
                        rows += 1
                    if not worked:                  # connected, given nothing: presence
                        _file(files, out, served, stamp).write(json.dumps(
                            {**_presence(stamp, window, rpc, prov, served), "policy": policy},
                            separators=(",", ":")) + "\n")
                        rows += 1
    finally:
        for f in files.values():
            f.close()
    return rows


def _row(rng: random.Random, t: float, window: float, rpc: str, prov: str, served_by: str,
         routed_by: str, calls: int, slow: bool, failing: bool) -> dict[str, Any]:
    errors = sum(rng.random() < (0.2 if failing else 0.002) for _ in range(calls))
    rejected = sum(rng.random() < 0.001 for _ in range(calls - errors))
    ack = sum(rng.random() < (0.01 if slow else 0.0005) for _ in range(calls - errors - rejected))
    timeouts = sum(rng.random() < (0.005 if slow else 0.0) for _ in
                   range(calls - errors - rejected - ack))
    ok = calls - errors - rejected - ack - timeouts
    buckets = [0] * (len(BOUNDS) + 1)
    sampled = calls // 8
    lat_sum, lo, hi = 0.0, math.inf, 0.0
    for _ in range(sampled):
        latency = rng.lognormvariate(math.log(0.02 if slow else 0.002), 0.6)
        buckets[bucket_of(latency)] += 1
        lat_sum += latency
        lo, hi = min(lo, latency), max(hi, latency)
    return {"schema_version": SCHEMA_VERSION, "window_start": t, "window_end": t + window,
            "rpc": rpc, "provider": prov, "served_by": served_by, "routed_by": routed_by,
            "calls": calls, "ok": ok, "rejected": rejected, "errors": errors,
            "ack_timeouts": ack, "response_timeouts": timeouts,
            "latency_bounds_s": list(BOUNDS), "latency_buckets": buckets,
            "latency_sampled": sampled, "latency_sum_s": round(lat_sum, 6),
            "latency_min_s": round(lo, 6) if sampled else None,
            "latency_max_s": round(hi, 6) if sampled else None,
            "peak_in_flight": max(1, int(calls / window * 0.01 * (10 if slow else 1))),
            "bytes_in": calls * 120, "bytes_out": ok * 480, "weight": 1.0}


def _split(rng: random.Random, provs: list[str], nodes: list[str], mean: float,
           hogs: tuple[str, ...], starved: Any,
           home: dict[str, str] | None = None,
           slowed: set[str] | None = None) -> dict[tuple[str, str], int]:
    """Each routing node's calls of an rpc in a window (about ``mean`` per provider, with
    noise), spread over the providers as a weighted random choice spreads them: a hog
    weighs 2, a starved provider 0, the others 1. With ``home`` (each provider's node:
    local-first), node i routes i times the first's calls, to its own providers if any,
    and a provider slow now weighs a tenth (that policy's choice weighs time taken)."""
    weight = {p: 0.0 if p in starved else 2.0 if p in hogs else 1.0 for p in provs}
    if home is not None:
        weight.update({p: weight[p] / 10 for p in slowed or ()})
    out = dict.fromkeys(((p, node) for p in provs for node in nodes), 0)
    for k, node in enumerate(nodes):
        scale = 1.0 if home is None else 2 * (k + 1) / (len(nodes) + 1)
        left = int(rng.expovariate(1.0) * mean * scale * len(provs))
        mine = provs if home is None else [p for p in provs if home[p] == node] or provs
        for i, p in enumerate(mine):          # binomial draws, one provider after another
            rest = sum(weight[q] for q in mine[i:])
            share = weight[p] / rest if rest else 0.0
            n = 0 if share == 0 else left if share >= 1 else max(0, min(left, round(
                rng.gauss(left * share, (left * share * (1 - share)) ** 0.5))))
            out[(p, node)] = n
            left -= n
    return out


def _spans(named: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """``NAME`` (always) or ``NAME@A-B`` (minutes A to B from the start) per provider."""
    spans = {}
    for item in named:
        name, _, when = item.partition("@")
        first, _, last = when.partition("-")
        spans[name] = (float(first or 0), float(last or math.inf))
    return spans


def _within(span: tuple[float, float] | None, minute: int) -> bool:
    return span is not None and span[0] <= minute < span[1]


def _presence(t: float, window: float, rpc: str, prov: str, served_by: str) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "window_start": t, "window_end": t + window,
            "rpc": rpc, "provider": prov, "served_by": served_by, "routed_by": served_by,
            "calls": 0, "ok": 0, "rejected": 0, "errors": 0, "ack_timeouts": 0,
            "response_timeouts": 0, "latency_bounds_s": list(BOUNDS),
            "latency_buckets": [0] * (len(BOUNDS) + 1), "latency_sampled": 0,
            "latency_sum_s": 0.0, "latency_min_s": None, "latency_max_s": None,
            "peak_in_flight": 0, "provider_peak_in_flight": 0, "bytes_in": 0, "bytes_out": 0,
            "weight": 1.0}


def _file(files: dict[str, Any], out: str, node: str, t: float) -> Any:
    tm = time.gmtime(t)
    folder = os.path.join(out, time.strftime("date=%Y-%m-%d", tm), time.strftime("hour=%H", tm),
                          f"node={node}")
    f = files.get(folder)
    if f is None:
        os.makedirs(folder, exist_ok=True)
        f = files[folder] = open(os.path.join(folder, f"part-{int(t)}-gen.jsonl"), "a")
    return f
