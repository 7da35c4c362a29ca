"""The per-minute rollup of the history and the figures read from it (PySpark, SQL text).

Every table of ``rpcbus analyze`` comes from a rollup of the rows (``rollup``: counters
and histograms added bucket by bucket, so a rollup of rollups is exact): ``per_minute``
and ``per_hour`` here, with ``finish`` (rates, mean latency, interpolated percentiles:
``quantiles``); the others on the driver with the same rules in numpy
(analytics/series.py, findings.py). No I/O here.
"""

from __future__ import annotations

from typing import Any

from rpcbus.schema import BOUNDS

QUANTILES = (0.5, 0.95, 0.99)
BUCKETS = len(BOUNDS) + 1
QUANTILE_COLUMNS = [f"p{round(q * 100)}_s" for q in QUANTILES]
KEYS = ["provider", "rpc", "served_by"]
COUNTS = ["calls", "ok", "rejected", "errors", "ack_timeouts", "response_timeouts"]


_SUMMED = ["peak_in_flight", "latency_sampled", "latency_sum_s", "latency_min_s",
           "latency_max_s", "bytes_in", "bytes_out", "latency_buckets", "weight_sum", "nrows",
           "local_first", "window_start", "window_end"]


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


def aggregate(rows: Any, keys: list[str], extra: list[Any] = ()) -> Any:
    """``rollup`` then ``finish``."""
    return finish(rollup(rows, keys, extra), keys)


def finish(sums: Any, keys: list[str]) -> Any:
    """The figures people read from a rollup: rates, mean latency, the percentiles of the
    summed histogram (``quantiles``), the mean weight (over the history rows). SQL text
    in three selects: built column by column, the findings' dozen ``finish`` calls cost
    seconds of py4j round trips and plan analysis per job."""
    q = quantiles("latency_buckets")
    rest = [c for c in sums.columns if c not in keys and c not in COUNTS and c not in _SUMMED
            and c not in QUANTILE_COLUMNS]
    rate = "CASE WHEN calls > 0 THEN ({}) / calls END AS {}"
    return (sums.selectExpr("*", f"{q['_c']} AS _c", f"{q['_total']} AS _total")
            .selectExpr("*", f"{q['_q']} AS _q")
            .selectExpr(
                *keys, *COUNTS, rate.format("errors", "error_rate"),
                rate.format("rejected", "reject_rate"),
                rate.format("ack_timeouts + response_timeouts", "timeout_rate"),
                rate.format("errors + ack_timeouts + response_timeouts", "failure_rate"),
                "peak_in_flight", "latency_sampled", "latency_sum_s", "latency_min_s",
                "latency_max_s", "CASE WHEN latency_sampled > 0 THEN latency_sum_s "
                "/ latency_sampled END AS latency_mean_s",
                *(f"{q[c]} AS {c}" for c in QUANTILE_COLUMNS),
                "bytes_in", "bytes_out", "weight_sum / nrows AS weight", "window_start",
                "window_end", *rest))


def quantiles(buckets: str) -> dict[str, str]:
    """SQL for p50_s, p95_s, p99_s of the summed histogram in column ``buckets`` (with
    ``latency_min_s`` / ``latency_max_s``, the sampled extremes), over two helper columns
    computed first: ``_c`` (the samples below each bucket) and ``_total``, then ``_q``
    (where each quantile lies).

    The bucket that holds the q-quantile is found exactly (the first whose running count
    reaches it, compared in integers: ``running * 100 >= total * 95``); within it the
    value is interpolated log-linearly by the quantile's rank among the bucket's samples
    (linearly in the first bucket, from 0), and clamped to the sampled min and max (the
    last bucket, over 60 s, reaches to the max). So a quantile is never outside the
    bucket that holds the true one: its error is at most that bucket's width (bounds
    2 - 2.5x apart), and a provider whose samples all lie close together reads true.

    Plain arithmetic Spark compiles: the running counts once, then per quantile the
    count of running counts still short of it. (A CASE per bucket outgrew the JVM's
    method size; a running sum made with ``slice`` cost 20 times more; one ``aggregate``
    lambda pass, interpreted, cost 8 s per 170k rows.)"""
    lows = "array(double(0), " + ", ".join(f"double({b!r})" for b in BOUNDS) + ")"
    highs = "array(" + ", ".join(f"double({b!r})" for b in BOUNDS) + ", double('inf'))"
    pcts = [round(q * 100) for q in QUANTILES]
    running = [f"get({buckets}, 0)"]
    for i in range(1, BUCKETS):
        running.append(f"({running[-1]} + get({buckets}, {i}))")
    out = {"_total": running[-1],
           # per quantile: the 1-based index of its bucket (the buckets whose running count
           # is still short of it, plus one) and the samples below that bucket
           "_q": "named_struct(" + ", ".join(
               f"'q{k}', 1 + " + " + ".join(f"int(_c[{i}] * 100 < _total * {pct})"
                                             for i in range(1, BUCKETS))
               for k, pct in enumerate(pcts)) + ")",
           "_c": f"array(0L, {', '.join(running[:-1])})"}
    for k, pct in enumerate(pcts):   # q counts from 1: element_at's index
        lo, hi = f"element_at({lows}, _q.q{k})", f"element_at({highs}, _q.q{k})"
        hi = f"IF({hi} = double('inf'), coalesce(latency_max_s, {lo}), {hi})"
        frac = (f"(_total * {pct} / 100.0 - element_at(_c, _q.q{k})) "
                f"/ element_at({buckets}, _q.q{k})")
        value = f"IF({lo} > 0 AND {hi} > {lo}, {lo} * pow({hi} / {lo}, {frac}), " \
                f"{lo} + ({hi} - {lo}) * {frac})"
        clamped = f"least(greatest({value}, coalesce(latency_min_s, 0D)), " \
                  f"coalesce(latency_max_s, double('inf')))"
        out[f"p{pct}_s"] = f"CASE WHEN _total > 0 THEN {clamped} END"
    return out


def per_period(minutes: Any, seconds: int, span: tuple[float, float]) -> Any:
    """The per-period table: per provider, rpc, serving node and period of ``seconds``.
    ``calls_per_s`` divides by the part of the period inside the history's ``span``
    (first window start, last window end): a partial first or last period reads its
    real rate."""
    from pyspark.sql import functions as F

    keys = [*KEYS, "period_start"]
    if seconds == 60:   # the rollup is the per-minute table already
        table = finish(minutes.withColumnRenamed("minute", "period_start"), keys)
    else:
        keyed = minutes.withColumn("period_start",
                                   (F.floor(F.col("minute") / seconds) * seconds).cast("long"))
        table = aggregate(keyed, keys)
    table = table.drop("window_start", "window_end")
    return table.withColumn("calls_per_s", calls_per_s("period_start", seconds, span))


def calls_per_s(start: str, seconds: float, span: tuple[float, float]) -> Any:
    """The column of calls per second of the periods [``start``, ``start`` + ``seconds``):
    ``calls`` over the seconds of the period inside ``span`` (a partial first or last
    period counts its real span; null where none of it is inside)."""
    from pyspark.sql import functions as F

    begin = F.col(start)
    inside = F.greatest(F.lit(0.0), F.least(begin + seconds, F.lit(span[1]))
                        - F.greatest(begin.cast("double"), F.lit(span[0])))
    return F.try_divide(F.col("calls"), inside)


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
