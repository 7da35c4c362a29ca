"""``rpcbus analyze``: the PySpark job over the nodes' provider load history.

Reads the JSON-lines history (docs/history.md) under ``--history`` (a local
directory, or any path Spark reads: ``hdfs://``, ``s3a://``) and writes Parquet
tables under ``--out``:

- ``per_minute`` and ``per_hour``: per provider, rpc, serving node and period:
  calls, ok, rejected, errors, ack and response timeouts, throughput (calls/s
  over the period), error / reject / timeout rates, peak in flight, and latency
  p50 / p95 / p99 merged exactly from the windows' histograms.

A latency percentile here is exact with respect to the histograms: the upper
bound of the bucket that holds the q-quantile of the merged (added) buckets —
never an average of percentiles. The last bucket (over 60 s) reports
``Infinity``.

The same job runs on a cluster: ``spark-submit --master spark://HOST:7077
cluster/analysis.py --history s3a://bucket/history --out s3a://bucket/analysis``
(the module has a ``__main__``). Fairness, outliers, recommended weights and the
report are not built yet (issue 6 stays open).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from broker.rpcstats import BOUNDS

QUANTILES = (0.5, 0.95, 0.99)
PERIODS = {"per_minute": 60, "per_hour": 3600}
KEYS = ["provider", "rpc", "served_by"]
COUNTS = ["calls", "ok", "rejected", "errors", "ack_timeouts", "response_timeouts"]


def schema() -> Any:
    from pyspark.sql import types as T

    fields = [T.StructField("schema_version", T.IntegerType()),
              T.StructField("window_start", T.DoubleType()),
              T.StructField("window_end", T.DoubleType()),
              T.StructField("rpc", T.StringType()),
              T.StructField("provider", T.StringType()),
              T.StructField("served_by", T.StringType()),
              T.StructField("routed_by", T.StringType())]
    fields += [T.StructField(c, T.LongType()) for c in COUNTS]
    fields += [T.StructField("latency_buckets", T.ArrayType(T.LongType())),
               T.StructField("latency_sampled", T.LongType()),
               T.StructField("latency_sum_s", T.DoubleType()),
               T.StructField("latency_min_s", T.DoubleType()),
               T.StructField("latency_max_s", T.DoubleType()),
               T.StructField("peak_in_flight", T.LongType())]
    return T.StructType(fields)


def session(master: str = "local[*]") -> Any:
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master(master).appName("rpcbus-analyze")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.ui.showConsoleProgress", "false")   # ours prints instead
            .getOrCreate())


def stop(spark: Any) -> None:
    """Stop the session and its JVM (pyspark otherwise keeps the JVM until Python exits)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        SparkContext._gateway = SparkContext._jvm = None


def analyze(spark: Any, history: str, out: str, since: float | None = None,
            until: float | None = None) -> dict[str, int]:
    """Run the job; returns the rows written per table."""
    from pyspark.sql import functions as F

    rows = (spark.read.schema(schema()).option("recursiveFileLookup", "true")
            .json(history).where(F.col("schema_version") == 1))
    if since is not None:
        rows = rows.where(F.col("window_start") >= since)
    if until is not None:
        rows = rows.where(F.col("window_start") < until)
    rows = rows.cache()
    written = {}
    for name, seconds in PERIODS.items():
        table = _per_period(rows, seconds)
        table.write.mode("overwrite").parquet(f"{out}/{name}")
        written[name] = spark.read.parquet(f"{out}/{name}").count()
    rows.unpersist()
    return written


def _per_period(rows: Any, seconds: int) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keyed = rows.withColumn("period_start",
                            (F.floor(F.col("window_start") / seconds) * seconds).cast("long"))
    keys = [*KEYS, "period_start"]
    sums = keyed.groupBy(*keys).agg(
        *[F.sum(c).alias(c) for c in COUNTS],
        F.max("peak_in_flight").alias("peak_in_flight"),
        F.sum("latency_sampled").alias("latency_sampled"),
        F.sum("latency_sum_s").alias("latency_sum_s"),
        F.min("latency_min_s").alias("latency_min_s"),
        F.max("latency_max_s").alias("latency_max_s"))
    # merge the histograms exactly: add bucket by bucket, then find each quantile's bucket
    buckets = (keyed.select(*keys, F.posexplode("latency_buckets").alias("pos", "n"))
               .groupBy(*keys, "pos").agg(F.sum("n").alias("n")))
    running = Window.partitionBy(*keys).orderBy("pos").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    buckets = (buckets.withColumn("cum", F.sum("n").over(running))
               .withColumn("total", F.sum("n").over(Window.partitionBy(*keys))))
    bounds = F.array(*[F.lit(float(b)) for b in BOUNDS], F.lit(float("inf")))
    quantiles = buckets.groupBy(*keys).agg(*[
        F.min(F.when((F.col("total") > 0) & (F.col("cum") >= F.col("total") * q), F.col("pos")))
        .alias(f"_q{i}") for i, q in enumerate(QUANTILES)])
    quantiles = quantiles.select(*keys, *[
        F.element_at(bounds, F.col(f"_q{i}") + 1).alias(f"p{int(q * 100)}_s")
        for i, q in enumerate(QUANTILES)])
    table = sums.join(quantiles, keys, "left")
    calls = F.col("calls")
    return table.select(
        *keys, *COUNTS,
        (calls / F.lit(float(seconds))).alias("calls_per_s"),
        F.when(calls > 0, F.col("errors") / calls).alias("error_rate"),
        F.when(calls > 0, F.col("rejected") / calls).alias("reject_rate"),
        F.when(calls > 0, (F.col("ack_timeouts") + F.col("response_timeouts")) / calls)
        .alias("timeout_rate"),
        "peak_in_flight", "latency_sampled", "latency_sum_s", "latency_min_s",
        "latency_max_s", "p50_s", "p95_s", "p99_s")


class _Progress:
    """Prints Spark's active stages and their tasks done while the job runs."""

    def __init__(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(1.0):
            parts = []
            for sid in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(sid)
                if info is not None:
                    parts.append(f"stage {sid}: {info.numCompletedTasks}/{info.numTasks}")
            print(f"\r  {time.monotonic() - t0:6.1f} s  {', '.join(parts) or 'working'}"
                  + " " * 20, end="", flush=True)

    def __enter__(self) -> "_Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        print()


def main(argv: list[str] | None = None) -> dict[str, int]:
    ap = argparse.ArgumentParser(prog="rpcbus analyze", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", required=True, help="the nodes' history directory (or URL)")
    ap.add_argument("--out", required=True, help="where the Parquet tables go")
    ap.add_argument("--since", help="first window to include (ISO date/time, UTC)")
    ap.add_argument("--until", help="end of the windows to include (ISO, UTC, exclusive)")
    ap.add_argument("--master", default="local[*]", help="Spark master [local[*]]")
    args = ap.parse_args(argv)
    started = time.monotonic()
    spark = session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with _Progress(spark):
            written = analyze(spark, args.history, args.out, _instant(args.since),
                              _instant(args.until))
    finally:
        stop(spark)
    for name, n in written.items():
        print(f"  {name}: {n:,} rows -> {args.out}/{name}")
    print(f"done in {time.monotonic() - started:.1f} s")
    return written


def _instant(text: str | None) -> float | None:
    if not text:
        return None
    from datetime import datetime, timezone

    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


if __name__ == "__main__":
    main()
