"""The per-minute rollup on the driver: what the findings are computed from.

The findings (analytics/findings.py) read the rollup many ways: per rpc and minute, per
provider, each provider against the others of its rpc minute by minute. As Spark queries
that was a dozen jobs over a small table, each paying Spark's fixed cost (planning,
code generation, scheduling: 35 s of an 80 s analysis of 10M rows, docs/performance-archive.md);
here the rollup comes to the driver in one query, as one row per (provider, rpc,
serving node) holding that series' minutes as arrays, and everything else is numpy.

It comes one rpc at a time (``stream``): Spark sends it in partitions of bounded size,
each rpc's series whole and in order, and the caller keeps what it needs of an rpc (its
grid, ~60 bytes per provider and minute) before the next arrives. So neither the
driver's JVM nor its Python process ever holds the whole rollup (~450 bytes per
provider, rpc and minute in numpy, several times that while it arrives), and no
result exceeds ``spark.driver.maxResultSize``.

No I/O but ``stream``; the helpers are pure and tested without Spark.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcbus.analytics.rollup import COUNTS
from rpcbus.schema import BOUNDS

BUCKETS = len(BOUNDS) + 1
LOWS = np.array([0.0, *BOUNDS])
HIGHS = np.array([*BOUNDS, np.inf])
# summed per minute; ``latency_min_s``/``latency_max_s`` NaN when nothing was sampled
SUMS = [*COUNTS, "latency_sampled", "latency_sum_s", "bytes_in", "bytes_out", "weight_sum",
        "nrows", "local_first"]
FIELDS = ["minute", *SUMS, "peak_in_flight", "latency_min_s", "latency_max_s", "window_start",
          "window_end", "recorded"]
MOST = ("peak_in_flight", "latency_max_s", "window_end")   # merged by their most
LEAST = ("latency_min_s", "window_start")                  # by their least


@dataclass
class Series:
    """One (provider, rpc, serving node): its minutes (ascending) and, per minute, every
    rollup column (``cols``, float64 arrays) and the histogram (``buckets``, minutes x
    BUCKETS)."""

    provider: str
    rpc: str
    served_by: str
    cols: dict[str, np.ndarray]
    buckets: np.ndarray

    @property
    def minutes(self) -> np.ndarray:
        return self.cols["minute"]


ROW_BYTES = 600   # a rollup row as Spark sends it to the driver, uncompressed, at most


def stream(minutes: Any, rows: int, part_bytes: int) -> Iterator[list[Series]]:
    """The rollup ``minutes`` (analytics/analysis.py, ``rows`` rows) as Series, one list per
    rpc (its series by provider and serving node; the rpcs in no particular order), each
    series' minutes in order. Spark hash-partitions the rollup by rpc into partitions of
    about ``part_bytes`` on average (an rpc is never split: a partition holds whole
    rpcs, one bigger than ``part_bytes`` alone) and sends them one at a time
    (``toLocalIterator``, the next computed while Python takes one: 1.7 -> 1.2 s at
    10M rows): the driver's JVM holds two partitions at most, Python one rpc. Nulls
    become 0 in the sums and NaN in the extremes (so the arrays line up). Spark's errors
    propagate; stopping early (closing the generator) leaves the rest unsent."""
    from pyspark.sql import functions as F

    nan = F.lit(float("nan"))
    parts = [F.col("minute").cast("double").alias("minute"),
             *(F.coalesce(F.col(c).cast("double"), F.lit(0.0)).alias(c)
               for c in [*SUMS, "peak_in_flight", "recorded"]),
             *(F.coalesce(F.col(c), nan).alias(c)
               for c in ("latency_min_s", "latency_max_s", "window_start", "window_end")),
             F.col("latency_buckets")]
    count = max(1, -(-rows * ROW_BYTES // part_bytes))
    # partitioned by rpc, the grouping below needs no other shuffle (a range partitioning
    # would split big rpcs, but first samples the rollup, a job of its own)
    grouped = (minutes.repartition(count, "rpc").groupBy("provider", "rpc", "served_by")
               .agg(F.sort_array(F.collect_list(F.struct(*parts))).alias("s"))
               .sortWithinPartitions("rpc", "provider", "served_by"))
    sent = grouped.select("provider", "rpc", "served_by",
                          *(F.col(f"s.{c}").alias(c) for c in FIELDS),
                          F.flatten("s.latency_buckets").alias("latency_buckets"))
    mine: list[Series] = []
    for r in sent.toLocalIterator(prefetchPartitions=True):
        if mine and mine[0].rpc != r["rpc"]:
            yield mine
            mine = []
        cols = {c: np.asarray(r[c], dtype=np.float64) for c in FIELDS}
        hist = np.asarray(r["latency_buckets"], dtype=np.int64).reshape(  # never null
            len(cols["minute"]), BUCKETS)
        mine.append(Series(r["provider"], r["rpc"], r["served_by"], cols, hist))
    if mine:
        yield mine


@dataclass
class Merged:
    """Series merged over some keys (e.g. an rpc's providers and serving nodes), per
    minute: the minutes, the sums and extremes (``cols``), the histograms."""

    minutes: np.ndarray
    cols: dict[str, np.ndarray]
    buckets: np.ndarray


def merge(series: Sequence[Series | Merged], by_minute: bool = True) -> Merged:
    """Add ``series`` minute by minute (``by_minute``) or all into one (minutes: the
    first). Sums add, ``peak_in_flight`` and ``latency_max_s``/``window_end`` take the
    most, ``latency_min_s``/``window_start`` the least, as the Spark rollup merges."""
    minute = np.concatenate([s.minutes for s in series])
    if by_minute:
        keys, at = np.unique(minute, return_inverse=True)
    else:
        keys, at = minute[:1], np.zeros(len(minute), np.int64)
    n = len(keys)
    cols: dict[str, np.ndarray] = {"minute": keys.astype(np.float64)}
    for c in SUMS:
        cols[c] = np.bincount(at, np.concatenate([s.cols[c] for s in series]), n)
    for names, ufunc in ((MOST, np.fmax), (LEAST, np.fmin)):
        for c in names:
            acc = np.full(n, -np.inf if c == "peak_in_flight" else np.nan)
            ufunc.at(acc, at, np.concatenate([s.cols[c] for s in series]))
            cols[c] = acc
    buckets = np.zeros((n, BUCKETS), np.int64)
    np.add.at(buckets, at, np.concatenate([s.buckets for s in series]))
    return Merged(keys, cols, buckets)


def per_node(series: list[Series], into: dict[str, Merged] | None = None
             ) -> dict[str, Merged]:
    """Each serving node's series merged minute by minute (clock skew, throughput), added
    to ``into`` (the same of earlier series) when given."""
    nodes: dict[str, list[Series | Merged]] = {n: [m] for n, m in (into or {}).items()}
    for s in series:
        nodes.setdefault(s.served_by, []).append(s)
    return {node: merge(mine) for node, mine in nodes.items()}


def presence(series: list[Series]) -> set[str]:
    """The serving nodes that write presence rows: a presence row is seen (no calls, no
    peak), or rows carry ``provider_peak_in_flight`` (``recorded``: nodes since 0.2, which
    write them whenever a provider has nothing, so a busy node that never had to is
    known too)."""
    return {s.served_by for s in series
            if np.any((s.cols["calls"] == 0) & (s.cols["peak_in_flight"] == 0))
            or np.any(s.cols.get("recorded", np.zeros(1)) > 0)}


def failed(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Errors and timeouts: the calls that failed."""
    total: np.ndarray = cols["errors"] + cols["ack_timeouts"] + cols["response_timeouts"]
    return total


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den``, NaN where ``den`` is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def quantiles(buckets: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              qs: tuple[float, ...]) -> dict[float, np.ndarray]:
    """Per row of ``buckets`` (rows x BUCKETS), the q-quantiles of the histogram (NaN where
    nothing was sampled), with ``lo``/``hi`` the sampled extremes (NaN: not known).

    The bucket that holds the q-quantile is found exactly (the first whose running count
    reaches it, compared in integers: ``running * 100 >= total * 95``); within it the
    value is interpolated log-linearly by the quantile's rank among the bucket's samples
    (linearly in the first bucket, from 0), and clamped to the sampled min and max (the
    last bucket, over 60 s, reaches to the max). So a quantile is never outside the
    bucket that holds the true one: its error is at most that bucket's width (bounds
    2 - 2.5x apart), and a provider whose samples all lie close together reads true."""
    total = buckets.sum(axis=1)
    below = np.cumsum(buckets, axis=1) - buckets          # samples below each bucket
    rows = np.arange(len(buckets))
    out = {}
    for q in qs:
        pct = round(q * 100)
        at = (below[:, 1:] * 100 < (total * pct)[:, None]).sum(axis=1)
        a, b = LOWS[at], HIGHS[at]
        b = np.where(np.isinf(b), np.where(np.isnan(hi), a, hi), b)
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = (total * pct / 100.0 - below[rows, at]) / buckets[rows, at]
            value = np.where((a > 0) & (b > a), a * np.power(b / np.where(a > 0, a, 1.0), frac),
                             a + (b - a) * frac)
        value = np.minimum(np.maximum(value, np.where(np.isnan(lo), 0.0, lo)),
                           np.where(np.isnan(hi), np.inf, hi))
        out[q] = np.where(total > 0, value, np.nan)
    return out


def others_median(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a matrix of providers x columns (NaN: no value), per cell the median of the
    column's *other* providers' values (the middle two averaged, like Spark's
    ``percentile(x, 0.5)``; NaN when none), and per cell how many others have a value.

    A column sorted once serves every provider: leaving out one value moves the middle
    by at most one place."""
    p = values.shape[0]
    order = np.argsort(values, axis=0, kind="stable")   # NaN last
    ranked = np.take_along_axis(values, order, axis=0)
    mine = ~np.isnan(values)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p)[:, None].repeat(values.shape[1], 1), axis=0)
    k = mine.sum(axis=0)[None, :] - mine                 # the others' values
    cols = np.arange(values.shape[1])[None, :].repeat(p, 0)

    def nth(j: np.ndarray) -> np.ndarray:               # j-th of the others, in order
        j = np.clip(j, 0, p - 1)
        skip = mine & (j >= rank)
        picked: np.ndarray = ranked[np.clip(j + skip, 0, p - 1), cols]
        return picked

    low, high = nth((k - 1) // 2), nth(k // 2)
    median = np.where(k % 2 == 1, low, (low + high) / 2)
    return np.where(k > 0, median, np.nan), k


def median(values: list[float]) -> float | None:
    """The median of the values that are not NaN (the middle two averaged), None if none."""
    kept = [v for v in values if v == v]
    return float(np.median(kept)) if kept else None
