"""``rpcbus history-gen``: a realistic synthetic load history, for tests and scale runs.

Writes the same rows, files and partitions as the nodes (broker/history.py,
docs/history.md): N nodes, M providers spread over them, K rpcs each provided
by a few providers, windows over a time span; load follows a daily curve with
noise; providers named in ``slow`` answer ~10x slower, those in ``failing``
fail ~20% of their calls, those in ``hogs`` get twice their share (as if the choice
were unfair). Deterministic for a given ``seed``.
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
             rate: float = 50.0) -> int:
    """Write the history under ``out``; returns the number of rows."""
    rng = random.Random(seed)
    start = start if start is not None else 1_793_000_000.0    # 2026-10-27, a fixed instant
    start -= start % window
    node_names = [f"n{i + 1}" for i in range(nodes)]
    provider_names = [f"p{i + 1}" for i in range(providers)]
    home = {p: node_names[i % nodes] for i, p in enumerate(provider_names)}
    rpc_names = [f"svc{i + 1}.call" for i in range(rpcs)]
    serving = {r: rng.sample(provider_names, min(len(provider_names), rng.randint(2, 3)))
               for r in rpc_names}
    files: dict[str, Any] = {}
    rows = 0
    try:
        for w in range(int(hours * 3600 / window)):
            t = start + w * window
            daily = 1.0 + 0.5 * math.sin(2 * math.pi * (t % 86400) / 86400)
            for rpc, provs in serving.items():
                for prov in provs:
                    for routed_by in node_names:
                        calls = int(rng.expovariate(1.0) * rate * daily * window / nodes
                                    * (2 if prov in hogs else 1))
                        if calls == 0:
                            continue
                        row = _row(rng, t, window, rpc, prov, home[prov], routed_by, calls,
                                   prov in slow, prov in failing)
                        f = _file(files, out, home[prov], t)
                        f.write(json.dumps(row, separators=(",", ":")) + "\n")
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


def _file(files: dict[str, Any], out: str, node: str, t: float) -> Any:
    tm = time.gmtime(t)
    folder = os.path.join(out, time.strftime("date=%Y-%m-%d", tm), time.strftime("hour=%H", tm),
                          f"node={node}")
    f = files.get(folder)
    if f is None:
        os.makedirs(folder, exist_ok=True)
        f = files[folder] = open(os.path.join(folder, f"part-{int(t)}-gen.jsonl"), "a")
    return f
