"""``rpcbus analyze`` as a user waits for it: the CLI, end to end, against a bare pass.

    python -m rpcbus.benchmarks.analysis_e2e [--rows 1e6,1e7] [--rounds 2] [--master local[2]]

For each size, a synthetic history in the nodes' schema (benchmarks/analysis_scale.py
``generate``: JSON lines in ``date=/hour=`` folders) is written once, then each round
times, one after another on the same files, every one a new process:

- **cli**: ``python -m rpcbus.broker analyze --history H --out O --master M``, from the
  command's start to its exit (the JVM's start, the read and rollup, the findings, the
  tables, weights.json and the report);
- **bare**: a fresh JVM with Spark's own settings (``local`` master as given, the UI
  off) that reads the rows with Spark's own reader and rolls them up per (provider,
  rpc, serving node, minute) into Parquet (analysis_scale ``bare``), then stops: the
  least any per-minute analysis on Spark waits for, written as anyone would write it;
- **duckdb** (if the ``duckdb`` package is installed): the same rollup in DuckDB, one
  process, no JVM: the practical floor on one machine.

Prints each round and a table of the medians with cli ÷ bare (the goal: at most 1.5×)
and DuckDB's time beside them. Everything goes under ``--dir`` (deleted afterwards unless
--keep; a history kept there from an earlier run of the same size is used again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

DUCKDB_ROLLUP = """
COPY (
  SELECT provider, rpc, served_by, CAST(floor(window_start / 60) * 60 AS BIGINT) AS minute,
         sum(calls) AS calls,
         quantile_cont(latency_sum_s / nullif(latency_sampled, 0), [0.5, 0.95, 0.99]) AS p
  FROM read_ndjson_auto('{history}/**/*.json', hive_partitioning = false)
  GROUP BY ALL
) TO '{out}' (FORMAT parquet)
"""


def bare_in_new_jvm(history: str, out: str, master: str) -> None:
    """The bare pass in this process's own new JVM, with Spark's settings; the JVM stops
    before this returns."""
    from pyspark.sql import SparkSession

    from rpcbus.analytics import analysis
    from rpcbus.benchmarks.analysis_scale import bare

    spark = (SparkSession.builder.master(master).appName("bare-pass")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        bare(spark, history, out, "json")
    finally:
        analysis.stop(spark)


def timed(argv: list[str]) -> float:
    """Wall seconds of one process, from its start to its exit; its output is kept only
    when it fails (raised, with its last lines)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n"
                         + proc.stdout[-1500:] + proc.stderr[-3000:])
    return took


def generate(n: int, history: str, master: str) -> None:
    from rpcbus.analytics import analysis
    from rpcbus.benchmarks.analysis_scale import generate as write_rows

    spark = analysis.session(master, {"spark.driver.memory": "4g"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        write_rows(spark, n, history, "json")
    finally:
        analysis.stop(spark)


def have_duckdb() -> bool:
    try:
        import duckdb  # noqa: F401  (only whether it is there)
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1e6,1e7", help="history sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per size (medians kept)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="work directory [a new one in /tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the generated histories")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--bare", nargs=2, metavar=("HISTORY", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bare:   # one bare pass, as a process of its own (the rounds start these)
        bare_in_new_jvm(*args.bare, args.master)
        return []
    work = args.dir or tempfile.mkdtemp(prefix="rpcbus-e2e-")
    py = sys.executable
    duck = have_duckdb()
    results = []
    try:
        for n in [int(float(x)) for x in args.rows.split(",")]:
            history = os.path.join(work, f"history-{n}")
            if os.path.exists(os.path.join(history, "_SUCCESS")):
                print(f"{n:>12,} rows: the history kept in {history}", flush=True)
            else:
                t0 = time.perf_counter()
                generate(n, history, args.master)
                print(f"{n:>12,} rows generated in {time.perf_counter() - t0:6.1f} s",
                      flush=True)
            runs: dict[str, list[float]] = {"cli": [], "bare": [], "duckdb": []}
            for i in range(args.rounds):
                out = os.path.join(work, f"out-{n}-{i}")
                runs["cli"].append(timed([py, "-m", "rpcbus.broker", "analyze", "--history",
                                          history, "--out", out, "--master", args.master]))
                runs["bare"].append(timed([py, "-m", "rpcbus.benchmarks.analysis_e2e",
                                           "--master", args.master, "--bare", history,
                                           os.path.join(work, f"bare-{n}-{i}")]))
                if duck:
                    query = DUCKDB_ROLLUP.format(history=history,
                                                 out=os.path.join(work, f"duck-{n}-{i}.parquet"))
                    runs["duckdb"].append(timed([py, "-c", "import duckdb, sys; "
                                                 "duckdb.sql(sys.argv[1])", query]))
                print(f"{'':>12} round {i + 1}: " + "  ".join(
                    f"{k} {v[-1]:6.1f} s" for k, v in runs.items() if v), flush=True)
            med = {k: statistics.median(v) for k, v in runs.items() if v}
            results.append({"rows": n, **{f"{k}_s": round(v, 2) for k, v in med.items()},
                            "cli_over_bare": round(med["cli"] / med["bare"], 3),
                            "runs": runs})
            if not args.keep:
                shutil.rmtree(history, ignore_errors=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n(JSON-lines history, {args.master}, median of {args.rounds})\n"
          "| rows | rpcbus analyze (CLI) | bare Spark pass, new JVM | CLI ÷ bare | DuckDB |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        floor = f"{r['duckdb_s']:.1f} s" if "duckdb_s" in r else "not installed"
        print(f"| {r['rows']:,} | {r['cli_s']:.1f} s | {r['bare_s']:.1f} s | "
              f"{r['cli_over_bare']:.2f}× | {floor} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
