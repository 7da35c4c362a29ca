"""How ``rpcbus analyze`` scales: generated histories of 1M, 10M and 50M window-rows.

    python -m rpcbus.benchmarks.analysis_scale [--rows 1e6,1e7,5e7] [--master local[2]]

For each size, Spark writes a synthetic history as Parquet (the nodes' schema: 200
providers, 50 rpcs, 10 nodes, 2,000 rows per 10 s window; generation is timed apart),
then times, in the same session and run:

- **bare**: one ``groupBy(provider, rpc, node, minute).agg(sum(calls),
  percentile_approx(mean latency))`` pass over the rows, written as Parquet — the
  least any per-minute analysis must do;
- **whole**: the whole analysis (``rpcbus.analytics.analysis.analyze``: every table, findings,
  weights.json and the report).

Prints rows/s for both and whole ÷ bare (the goal: within 2×), and how time grows
with the rows. Everything goes under ``--dir`` (deleted afterwards unless --keep);
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


def generate(spark: Any, n: int, path: str) -> None:
    """``n`` rows in the history schema, deterministic, written as Parquet under ``path``."""
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
        (F.lit(1) + h % 9).alias("peak_in_flight"))
    rows = (rows.withColumn("window_end", F.col("window_start") + 10.0)
            .withColumn("ok", F.col("calls") - F.col("errors") - F.col("rejected")
                        - F.col("ack_timeouts"))
            .withColumn("latency_sampled",
                        F.expr("aggregate(latency_buckets, 0L, (a, x) -> a + x)"))
            .withColumn("latency_sum_s", F.col("latency_sampled") * 0.004)
            .withColumn("latency_min_s", F.lit(0.001)).withColumn("latency_max_s", F.lit(0.04))
            .withColumn("bytes_in", F.col("calls") * 120)
            .withColumn("bytes_out", F.col("ok") * 480).withColumn("weight", F.lit(1.0)))
    rows.write.mode("overwrite").parquet(path)


def bare(spark: Any, path: str, out: str) -> None:
    from pyspark.sql import functions as F

    rows = spark.read.parquet(path)
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
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--dir", default=None, help="work directory [a new one in /tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the generated histories")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    sizes = [int(float(x)) for x in args.rows.split(",")]
    work = args.dir or tempfile.mkdtemp(prefix="rpcbus-scale-")
    spark = analysis.session(args.master, {"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    try:
        for n in sizes:
            history = os.path.join(work, f"history-{n}")
            t0 = time.perf_counter()
            generate(spark, n, history)
            gen_s = time.perf_counter() - t0
            print(f"{n:>12,} rows generated in {gen_s:6.1f} s", flush=True)
            t0 = time.perf_counter()
            bare(spark, history, os.path.join(work, f"bare-{n}"))
            bare_s = time.perf_counter() - t0
            print(f"{'':>12} bare pass       {bare_s:6.1f} s  {n / bare_s:>12,.0f} rows/s",
                  flush=True)
            t0 = time.perf_counter()
            written = analysis.analyze(spark, history, os.path.join(work, f"out-{n}"),
                                       fmt="parquet")
            whole_s = time.perf_counter() - t0
            assert written["rows_read"] == n, written
            print(f"{'':>12} whole analysis  {whole_s:6.1f} s  {n / whole_s:>12,.0f} rows/s"
                  f"  = {whole_s / bare_s:.2f}x the bare pass", flush=True)
            results.append({"rows": n, "generate_s": round(gen_s, 2), "bare_s": round(bare_s, 2),
                            "whole_s": round(whole_s, 2), "ratio": round(whole_s / bare_s, 3),
                            "tables": written})
            if not args.keep:
                shutil.rmtree(history, ignore_errors=True)
    finally:
        analysis.stop(spark)
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| rows | bare pass | whole analysis | whole ÷ bare | whole rows/s |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']:,} | {r['bare_s']:.1f} s | {r['whole_s']:.1f} s | "
              f"{r['ratio']:.2f}× | {r['rows'] / r['whole_s']:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
