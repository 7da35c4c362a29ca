"""The per-period tables of ``rpcbus analyze``: ``per_minute`` and ``per_hour``, a row
per provider, rpc, serving node and period (docs/history.md), made on the driver from
the rollup as it arrives (analytics/series.py ``stream``: an rpc at a time, each
series' minutes in order) with the rules the other tables use (analytics/findings.py
``figure_columns``), and written a part at a time (analytics/files.py ``TableFile``).

As Spark jobs over the rollup they cost more than the findings and the report together
(two jobs' planning, code generation and Parquet commit, 4 s of CPU at 1M rows on 2
cores); here they add a few numpy passes per rpc. Pure: no I/O, no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rpcbus.analytics.findings import calls_per_s, figure_columns
from rpcbus.analytics.rollup import COUNTS, QUANTILE_COLUMNS
from rpcbus.analytics.series import LEAST, MOST, SUMS, Series

PERIODS = {"per_minute": 60, "per_hour": 3600}
_KEYS = ["provider", "rpc", "served_by"]
_LONGS = [*COUNTS, "peak_in_flight", "latency_sampled", "bytes_in", "bytes_out"]
_COLUMNS = [*COUNTS, "error_rate", "reject_rate", "timeout_rate", "failure_rate",
            "peak_in_flight", "latency_sampled", "latency_sum_s", "latency_min_s",
            "latency_max_s", "latency_mean_s", *QUANTILE_COLUMNS, "bytes_in", "bytes_out",
            "weight", "calls_per_s"]
#: the tables' columns, in order, and as Spark DDL
SCHEMA_COLUMNS = [*_KEYS, "period_start", *_COLUMNS]
SCHEMA = ", ".join([*(f"{k} STRING" for k in _KEYS), "period_start BIGINT",
                    *(f"{c} {'BIGINT' if c in _LONGS else 'DOUBLE'}" for c in _COLUMNS)])


def columns(series: Sequence[Series], seconds: int, span: tuple[float, float]
            ) -> dict[str, Any]:
    """The rows of the periods of ``seconds`` (60: the rollup's minutes themselves) that
    the minutes of ``series`` fall in, as columns named as ``SCHEMA`` says: the keys as
    lists of str, the rest numpy arrays (float64; NaN where Spark's SQL has null: a rate
    of no calls, a latency never sampled, a period outside ``span``). A period's sums
    add, its extremes take the most or the least, as the rollup merges rows; its
    ``calls_per_s`` divides by the part of it inside ``span``."""
    assert series and seconds % 60 == 0, (len(series), seconds)
    which = np.repeat(np.arange(len(series)), [len(s.minutes) for s in series])
    start = np.concatenate([s.minutes for s in series])
    cols = {c: np.concatenate([s.cols[c] for s in series]) for c in (*SUMS, *MOST, *LEAST)}
    buckets = np.concatenate([s.buckets for s in series])
    if seconds != 60:
        start = np.floor(start / seconds) * seconds
        # a series' minutes ascend, so the rows of one series and period lie together
        first = np.flatnonzero(np.r_[True, (np.diff(which) != 0) | (np.diff(start) != 0)])
        for c in SUMS:
            cols[c] = np.add.reduceat(cols[c], first)
        for names, ufunc in ((MOST, np.fmax), (LEAST, np.fmin)):
            for c in names:
                cols[c] = ufunc.reduceat(cols[c], first)
        buckets = np.add.reduceat(buckets, first, axis=0)
        which, start = which[first], start[first]
    assert len(start) == len(buckets) == len(cols["calls"])
    figures = figure_columns(cols, buckets)
    figures["calls_per_s"] = calls_per_s(start, cols["calls"], seconds, span)
    out: dict[str, Any] = {k: [getattr(series[i], k) for i in which.tolist()] for k in _KEYS}
    out["period_start"] = start
    out.update((c, figures[c]) for c in _COLUMNS)
    return out
