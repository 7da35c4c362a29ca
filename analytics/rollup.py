"""The per-minute rollup of the history (PySpark, SQL text).

Every table of ``rpcbus analyze`` comes from a rollup of the rows (``rollup``: counters
and histograms added bucket by bucket, so a rollup of rollups is exact), on the driver
(analytics/series.py, findings.py, periods.py: rates, mean latency, interpolated
percentiles). No I/O here.
"""

from __future__ import annotations

from typing import Any

from rpcbus.schema import BOUNDS

QUANTILES = (0.5, 0.95, 0.99)
BUCKETS = len(BOUNDS) + 1
QUANTILE_COLUMNS = [f"p{round(q * 100)}_s" for q in QUANTILES]
KEYS = ["provider", "rpc", "served_by"]
COUNTS = ["calls", "ok", "rejected", "errors", "ack_timeouts", "response_timeouts"]


def rollup(rows: Any, keys: list[str], extra: list[Any] = (), raw: bool = False) -> Any:
    """Sum ``rows`` (history rows, or an earlier rollup: they have the same columns) per
    ``keys``; histograms bucket by bucket, so a rollup of rollups is exact. One
    ``groupBy``, which Spark partly does before its shuffle.

    ``peak_in_flight``: the most of the rows'. With ``raw`` (history rows, one per
    routing node), of their ``provider_peak_in_flight`` (the provider's peak over all its
    routing nodes, sampled together, on each of the window's rows), or of their own
    ``peak_in_flight`` where a row has none (rows of nodes before 0.2: the most of one
    routing node's). With ``raw``, ``_suspect`` is 1 where the rows came from more than
    one file (``_file``): a node files its rows of one minute in one file unless it was
    restarted in that minute, so a copied file makes every minute it holds suspect
    (``analyze`` then looks for copies row by row). ``_file`` and ``_fsize``: one of the
    files and its size (the file of a group that is not suspect: analysis._oversized)."""
    from pyspark.sql import functions as F

    if not raw:
        return _sums(rows, keys, F.max("peak_in_flight"), extra)
    peak = F.max(F.coalesce("provider_peak_in_flight", "peak_in_flight"))
    files = [F.min("_file").alias("_file"), F.max("_file").alias("_f1"),
             F.max("_fsize").alias("_fsize")]
    return (_sums(rows, keys, peak, [*extra, *files])
            .withColumn("_suspect", (F.col("_file") != F.col("_f1")).cast("long"))
            .drop("_f1"))


def _sums(rows: Any, keys: list[str], peak: Any, extra: list[Any]) -> Any:
    """One ``groupBy(keys)`` of every summed column. The sums are SQL text, one py4j call
    each (built column by column they took ~80 calls per rollup, seconds per job)."""
    from pyspark.sql import functions as F

    buckets = ", ".join(f"coalesce(sum(get(latency_buckets, {i})), 0L)" for i in range(BUCKETS))
    sums = [*(f"sum({c}) AS {c}" for c in COUNTS),
            "sum(latency_sampled) AS latency_sampled", "sum(latency_sum_s) AS latency_sum_s",
            "min(latency_min_s) AS latency_min_s", "max(latency_max_s) AS latency_max_s",
            "sum(bytes_in) AS bytes_in", "sum(bytes_out) AS bytes_out",
            f"array({buckets}) AS latency_buckets", "sum(weight_sum) AS weight_sum",
            "sum(nrows) AS nrows", "sum(local_first) AS local_first",
            "min(window_start) AS window_start", "max(window_end) AS window_end"]
    return rows.groupBy(*keys).agg(peak.alias("peak_in_flight"),
                                   *(F.expr(x) for x in sums), *extra)


def moved_back(minutes: Any, leaps: list[dict[str, Any]]) -> Any:
    """The rollup ``minutes`` with each stepped clock's rows (analytics/skew.py
    ``leaps``) moved back by the step from the step on, summed again where a moved row
    meets one of the same minute (the minute the clock stepped in)."""
    from pyspark.sql import functions as F

    back: Any = F.lit(0)
    for leap in leaps:
        back = back + F.when((F.col("served_by") == leap["node"])
                             & (F.col("minute") >= leap["from_minute"]),
                             F.lit(int(leap["shift_s"]))).otherwise(0)
    moved = minutes.withColumn("_back", back).select(
        *(F.col(c) for c in minutes.columns if c not in ("minute", "window_start",
                                                          "window_end")),
        (F.col("minute") - F.col("_back")).alias("minute"),
        (F.col("window_start") - F.col("_back")).alias("window_start"),
        (F.col("window_end") - F.col("_back")).alias("window_end"))
    return rollup(moved, [*KEYS, "minute"], [F.max("recorded").alias("recorded")])
