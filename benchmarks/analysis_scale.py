"""How ``rpcbus analyze`` scales: generated histories of 1M, 10M and 50M window-rows.

    python -m rpcbus.benchmarks.analysis_scale [--rows 1e6,1e7,5e7] [--format json]

For each size, Spark writes a synthetic history (the nodes' schema: 200 providers,
50 rpcs, 10 nodes, 2,000 rows per 10 s window, in ``date=/hour=`` folders as nodes file
them; JSON lines like the nodes' own files, or ``--format parquet``; generation is timed
apart), then times, in the same session and run:

- **bare**: Spark's own reader (``spark.read.json`` with the schema), then one
  ``groupBy(provider, rpc, node, minute).agg(sum(calls), percentile_approx(mean
  latency))`` pass over the rows, written as Parquet — the least any per-minute
  analysis must do;
- **whole**: the whole analysis (``rpcbus.analytics.analysis.analyze``: every table, findings,
  weights.json and the report);
- **last 50 min**: the whole analysis with ``since`` 50 minutes before the history's
  end (only the hour folders that can hold those windows are read).

Before the first size, both run once untimed on a small history (``--warmup`` rows), so
the JVM's class loading and JIT warm-up are not charged to the first size.

Prints rows/s for both and whole ÷ bare (the goal: within 1.5× at 10M rows), and how
time grows with the rows. Everything goes under ``--dir`` (deleted afterwards unless --keep);
50M rows take about 2 GB there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

from rpcbus.analytics import analysis
from rpcbus.broker.rpcstats import BOUNDS

KEYS_PER_WINDOW = 2000


def generate(spark: Any, n: int, path: str, fmt: str = "json") -> float:
    """``n`` rows in the history schema, deterministic, written under ``path`` in
    ``date=/hour=`` folders; returns the end of the last window."""
    from pyspark.sql import functions as F

    k = F.col("id") % KEYS_PER_WINDOW
    h = F.abs(F.hash("id"))
    rows = spark.range(0, n, numPartitions=max(2, n // 2_000_000)).select(
        F.lit(1).alias("schema_version"),
        (F.lit(1_793_000_000.0) + (F.col("id") / KEYS_PER_WINDOW).cast("long") * 10.0)
        .alias("window_start"),
        F.concat(F.lit("svc"), (k % 50).cast("string"), F.lit(".call")).alias("rpc"),
        F.concat(F.lit("p"), ((k * 7 + k % 50) % 200).cast("string")).alias("provider"),
        F.concat(F.lit("n"), (((k * 7 + k % 50) % 200) % 10).cast("string")).alias("served_by"),
        F.concat(F.lit("n"), ((k / 200).cast("long") % 10).cast("string")).alias("routed_by"),
        (F.lit(1) + h % 200).alias("calls"), (h % 7 == 0).cast("long").alias("errors"),
        (h % 11 == 0).cast("long").alias("rejected"),
        (h % 101 == 0).cast("long").alias("ack_timeouts"),
        F.lit(0).cast("long").alias("response_timeouts"),
        F.expr(f"transform(sequence(0, {len(BOUNDS)}), i -> CASE WHEN i BETWEEN 3 AND 9 "
               "THEN bigint(pmod(hash(id, i), 6)) ELSE 0L END)").alias("latency_buckets"),
        (F.lit(1) + h % 9).alias("peak_in_flight"),
        (F.lit(10) + (F.col("id") / KEYS_PER_WINDOW).cast("long") % 7)   # over routing nodes
        .alias("provider_peak_in_flight"))
    rows = (rows.withColumn("window_end", F.col("window_start") + 10.0)
            .withColumn("ok", F.col("calls") - F.col("errors") - F.col("rejected")
                        - F.col("ack_timeouts"))
            .withColumn("latency_sampled",
                        F.expr("aggregate(latency_buckets, 0L, (a, x) -> a + x)"))
            .withColumn("latency_sum_s", F.col("latency_sampled") * 0.004)
            .withColumn("latency_min_s", F.lit(0.001)).withColumn("latency_max_s", F.lit(0.04))
            .withColumn("bytes_in", F.col("calls") * 120)
            .withColumn("bytes_out", F.col("ok") * 480).withColumn("weight", F.lit(1.0))
            .withColumn("date", F.date_format(F.timestamp_seconds("window_start"), "yyyy-MM-dd"))
            .withColumn("hour", F.date_format(F.timestamp_seconds("window_start"), "HH")))
    # one file per node and hour, as nodes write them (analysis.analyze compares the rows
    # of a node's minute that come from two files, as after a restart)
    (rows.repartition("date", "hour", "served_by").write.mode("overwrite")
     .partitionBy("date", "hour").format(fmt).save(path))
    return 1_793_000_000.0 + ((n - 1) // KEYS_PER_WINDOW + 1) * 10.0


def bare(spark: Any, path: str, out: str, fmt: str) -> None:
    from pyspark.sql import functions as F

    reader = spark.read.schema(analysis.schema()).option("recursiveFileLookup", "true")
    rows = reader.parquet(path) if fmt == "parquet" else reader.json(path)   # Spark's own
    (rows.withColumn("minute", (F.floor(F.col("window_start") / 60) * 60).cast("long"))
     .groupBy("provider", "rpc", "served_by", "minute")
     .agg(F.sum("calls").alias("calls"),
          F.percentile_approx(F.try_divide("latency_sum_s", "latency_sampled"),
                              [0.5, 0.95, 0.99]).alias("p"))
     .write.mode("overwrite").parquet(out))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1e6,1e7,5e7", help="history sizes, comma-separated")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--format", choices=("json", "parquet"), default="json",
                    help="how the history is written [json, as nodes write it]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--dir", default=None, help="work directory [a new one in /tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the generated histories")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--warmup", type=float, default=2e5,
                    help="rows of the untimed warm-up run (0: none)")
    args = ap.parse_args(argv)
    sizes = [int(float(x)) for x in args.rows.split(",")]
    fmt = args.format
    work = args.dir or tempfile.mkdtemp(prefix="rpcbus-scale-")
    spark = analysis.session(args.master, {"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    try:
        if args.warmup:
            t0 = time.perf_counter()
            history = os.path.join(work, "warmup")
            generate(spark, int(args.warmup), history, fmt)
            bare(spark, history, os.path.join(work, "bare-warmup"), fmt)
            analysis.analyze(spark, history, os.path.join(work, "out-warmup"), fmt=fmt)
            print(f"{'':>12} warm-up ({int(args.warmup):,} rows, untimed) "
                  f"{time.perf_counter() - t0:6.1f} s", flush=True)
        for n in sizes:
            history = os.path.join(work, f"history-{n}")
            t0 = time.perf_counter()
            end = generate(spark, n, history, fmt)
            gen_s = time.perf_counter() - t0
            print(f"{n:>12,} rows generated in {gen_s:6.1f} s", flush=True)
            t0 = time.perf_counter()
            bare(spark, history, os.path.join(work, f"bare-{n}"), fmt)
            bare_s = time.perf_counter() - t0
            print(f"{'':>12} bare pass       {bare_s:6.1f} s  {n / bare_s:>12,.0f} rows/s",
                  flush=True)
            t0 = time.perf_counter()
            written = analysis.analyze(spark, history, os.path.join(work, f"out-{n}"),
                                       fmt=fmt)
            whole_s = time.perf_counter() - t0
            assert written["rows_read"] == n, written
            print(f"{'':>12} whole analysis  {whole_s:6.1f} s  {n / whole_s:>12,.0f} rows/s"
                  f"  = {whole_s / bare_s:.2f}x the bare pass", flush=True)
            t0 = time.perf_counter()
            recent = analysis.analyze(spark, history, os.path.join(work, f"recent-{n}"),
                                      since=end - 3000, fmt=fmt)
            recent_s = time.perf_counter() - t0
            print(f"{'':>12} last 50 min     {recent_s:6.1f} s  "
                  f"({recent['rows_read']:,} rows read)", flush=True)
            results.append({"rows": n, "generate_s": round(gen_s, 2), "bare_s": round(bare_s, 2),
                            "whole_s": round(whole_s, 2), "ratio": round(whole_s / bare_s, 3),
                            "recent_s": round(recent_s, 2), "tables": written})
            if not args.keep:
                shutil.rmtree(history, ignore_errors=True)
    finally:
        analysis.stop(spark)
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n({fmt} history)\n| rows | bare pass | whole analysis | whole ÷ bare | "
          "whole rows/s | last 50 min |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']:,} | {r['bare_s']:.1f} s | {r['whole_s']:.1f} s | "
              f"{r['ratio']:.2f}× | {r['rows'] / r['whole_s']:,.0f} | {r['recent_s']:.1f} s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
