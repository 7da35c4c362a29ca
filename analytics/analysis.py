r"""``rpcbus analyze``: the PySpark job over the nodes' provider load history.

Reads the history (docs/history.md; JSON lines as the nodes write them, or Parquet
with the same columns) under ``--history`` (a local directory, or any path Spark
reads: ``hdfs://``, ``s3a://``) once, into a per-minute rollup, and writes under
``--out``:

- Parquet ``per_minute`` and ``per_hour``: per provider, rpc, serving node and period:
  calls, ok, rejected, errors, ack and response timeouts, throughput (calls/s over
  the period), error / reject / timeout / failure rates, peak in flight, bytes in and
  out, mean weight, and latency p50 / p95 / p99 of the merged histograms;
- Parquet ``per_provider`` (the same over the whole span, per rpc and provider) and
  the findings of analytics/findings.py: ``fairness``, ``outliers``, ``episodes``
  (analytics/episodes.py), ``hot_rpcs``, ``peak_minutes``, ``weights``, and
  ``clock_skew`` (analytics/skew.py);
- ``weights.json``: the recommended weights, the file nodes load (``rpc.weights_file``);
- ``report/report.html`` (self-contained, charts embedded), the charts as PNGs and
  ``report/findings.json`` (analytics/report.py).

A latency percentile here comes from the merged (added) histograms, never an average
of percentiles: the bucket that holds it exactly, the value within interpolated
(analytics/series.py ``quantiles``). Rows of another schema version, or that cannot be
parsed, are left out and counted (``rows_skipped``); so is a line over ``MAX_LINE``
bytes, which the reader skips unread (a node's row is a few hundred bytes; a line of
300 MB once ran the JVM out of memory).

The same job runs on a Spark cluster (docs/history.md): ship the packages with
``--py-files`` and give ``spark-submit`` this file::

    rpcbus analyze-bundle rpcbus.zip     # the SDK core and the analytics; prints the line below
    spark-submit --master spark://HOST:7077 --py-files rpcbus.zip .../rpcbus/analytics/analysis.py \
        --history s3a://bucket/history --out s3a://bucket/analysis --report-dir ./report
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any

import numpy as np

from rpcbus.analytics import files, findings, periods, series, skew
from rpcbus.analytics.periods import PERIODS
from rpcbus.analytics.rollup import COUNTS, KEYS, moved_back, rollup

PART_BYTES = 64 << 20   # the rollup comes to the driver in parts of about this (_part_bytes)
SERIAL_GC_CPUS = 2   # machines this small: the local JVM collects with one thread (session)
MAX_LINE = 1 << 20      # bytes: a longer line is skipped by the reader (_oversized counts)
MAX_ROW = 16 << 10      # bytes a row of the history may take at most (a node's: ~0.7 KB)


def schema() -> str:
    """The history's columns (docs/history.md), as Spark DDL; other fields are ignored."""
    counts = ", ".join(f"{c} BIGINT" for c in COUNTS)
    return ("schema_version INT, window_start DOUBLE, window_end DOUBLE, rpc STRING, "
            f"provider STRING, served_by STRING, routed_by STRING, {counts}, "
            "latency_buckets ARRAY<BIGINT>, latency_sampled BIGINT, latency_sum_s DOUBLE, "
            "latency_min_s DOUBLE, latency_max_s DOUBLE, peak_in_flight BIGINT, "
            "bytes_in BIGINT, bytes_out BIGINT, weight DOUBLE, provider_peak_in_flight BIGINT, "
            "policy STRING")


def session(master: str | None = "local[*]", conf: dict[str, str] | None = None) -> Any:
    """A Spark session; ``master`` None leaves it to spark-submit (else local[*]);
    ``conf``: more Spark settings (e.g. spark.driver.memory, before the JVM starts).
    A local JVM this starts on a machine of at most ``SERIAL_GC_CPUS`` CPUs collects
    garbage with one thread (``-XX:+UseSerialGC``, added to the driver's Java options
    unless they choose a collector): the JVM's own choice there, G1, runs marking
    threads of its own beside the two task threads (the CLI took 10-20 % more CPU).
    A local JVM listens on 127.0.0.1 only (unless ``SPARK_LOCAL_IP`` says otherwise).
    Under spark-submit the session is the one it made, settings and all."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    conf = dict(conf or {})
    launching = not os.environ.get("PYSPARK_GATEWAY_PORT")   # not under spark-submit
    local = launching and (master or "local").startswith("local")
    if local and (os.cpu_count() or 1) <= SERIAL_GC_CPUS:
        java = conf.get("spark.driver.extraJavaOptions", "")
        if not re.search(r"-XX:\+Use\w+GC\b", java):   # no collector chosen by the caller
            conf["spark.driver.extraJavaOptions"] = f"{java} -XX:+UseSerialGC".strip()
    if local and not os.environ.get("SPARK_LOCAL_IP"):
        # a local JVM talks to itself only: its driver, block manager and file server
        # listen on loopback (Spark's default is the host's first outside address)
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
        conf.setdefault("spark.driver.host", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, value)
    if master is not None:
        builder = builder.master(master)
    elif launching:
        builder = builder.master("local[*]")
    return (builder.appName("rpcbus-analyze")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.ui.showConsoleProgress", "false")   # ours prints instead
            # Code Spark generates for a stage whose method outgrows 8,000 bytes, the
            # most HotSpot compiles, would run interpreted: past it Spark makes small
            # methods instead
            .config("spark.sql.codegen.hugeMethodLimit", "8000")
            # Hadoop's line reader skips a longer line without holding it (_oversized)
            .config("spark.hadoop.mapreduce.input.linerecordreader.line.maxlength",
                    str(MAX_LINE))
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


def read_history(spark: Any, history: str, fmt: str = "auto", since: float | None = None,
                 until: float | None = None, hours: set[int] | None = None) -> Any:
    """The history rows (JSON lines as the nodes write them, or Parquet with the same
    columns); ``fmt`` "auto" picks Parquet when a local ``history`` holds .parquet files.
    With ``since``/``until`` (or ``hours``, a set of hours' starts), only the
    ``date=/hour=`` folders that can hold windows of that span (of those hours) are read
    (``hour_folders``); rows are still filtered exactly by the caller.
    Column ``_file`` tells the file each row came from (a hash of its path; ``rollup``)."""
    from pyspark.sql import functions as F

    if fmt == "auto":
        fmt = "parquet" if _has_parquet(history) else "json"
    paths: list[str] | None = [history]
    if since is not None or until is not None or hours is not None:
        paths = hour_folders(spark, history, since, until, hours)
    if paths == []:       # laid out by hour, and no hour of the span is there
        rows = (spark.createDataFrame([], schema()).withColumn("_file", F.lit(0).cast("long"))
                .withColumn("_fsize", F.lit(0).cast("long")))
    else:
        reader = spark.read.option("recursiveFileLookup", "true")
        paths = paths or [history]
        if fmt == "parquet":
            rows = reader.schema(schema()).parquet(*paths)
        else:
            rows = reader.schema(schema()).json(paths)
        rows = (rows.withColumn("_file", F.xxhash64("_metadata.file_path"))
                .withColumn("_fsize", F.col("_metadata.file_size")))
    return rows.withColumn("weight", F.coalesce(F.col("weight"), F.lit(1.0)))


def hour_folders(spark: Any, history: str, since: float | None, until: float | None,
                 hours: set[int] | None = None) -> list[str] | None:
    """The ``DIR/date=YYYY-MM-DD/hour=HH`` folders of ``history`` whose hour overlaps
    [``since``, ``until``) and, if ``hours`` is given, starts at one of them (listed
    through Hadoop's FileSystem, so local, hdfs:// and s3a:// alike). A node files a
    window under the hour of its start, so nothing in the span is missed. None when
    ``history`` is not laid out so (then everything is read)."""
    from datetime import datetime, timezone

    jvm = spark.sparkContext._jvm
    pattern = jvm.org.apache.hadoop.fs.Path(history.rstrip("/") + "/date=*/hour=*")
    fs = pattern.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    found = fs.globStatus(pattern) or []
    if not found:
        return None
    kept = []
    for status in found:
        path = status.getPath()
        try:
            hour = int(path.getName().removeprefix("hour="))
            day = datetime.strptime(path.getParent().getName().removeprefix("date="),
                                    "%Y-%m-%d")
        except ValueError:
            continue
        start = day.replace(hour=hour, tzinfo=timezone.utc).timestamp()
        if ((since is None or start + 3600 > since) and (until is None or start < until)
                and (hours is None or int(start) in hours)):
            kept.append(str(path.toString()))
    return kept


def _has_parquet(path: str) -> bool:
    if "://" in path and not path.startswith("file://"):
        return False
    for _, _, names in os.walk(path.removeprefix("file://")):
        if any(f.endswith(".parquet") for f in names):
            return True
    return False


def analyze(spark: Any, history: str, out: str, since: float | None = None,
            until: float | None = None, half_life: float = 3600.0, fmt: str = "auto",
            report: bool = True, report_dir: str | None = None) -> dict[str, int]:
    """Run the job; returns the rows written per table (and ``rows_read``, ``rows_skipped``:
    rows of another schema version or that could not be parsed, and ``rows_duplicate``:
    exact copies of another row; both are left out). Raises NothingToAnalyse when no row
    is left.

    The history is read once, into a per-minute rollup (provider, rpc, serving node,
    minute: counters, summed histograms, weights) kept in memory; every table comes
    from that rollup, which merges exactly like the rows themselves."""
    from pyspark.sql import functions as F

    def rows_of(hours: set[int] | None = None) -> Any:
        return _prepared(read_history(spark, history, fmt, since, until, hours), since, until)

    # A row is one node's count of one window, rpc, provider and routing node; one whose
    # every field equals another's is a copy (a file copied twice) and counts once. (Rows
    # of one key that differ are kept: a node restarted inside a window writes two.)
    # Copies are rare, and comparing whole rows costs more than the rest of the job: the
    # rollup flags the minutes whose rows came from two files (``_suspect``: a restart or
    # a copy), their hours are read again and their rows compared (``_copies``), and only
    # if a row is there twice is the rollup made again from distinct rows (a second read
    # of everything; rows alike but for the file they came from are copies).
    reading = time.time()  # files changed after this are being written: not judged whole
    rows = rows_of()
    every, counted, clocks = _rollup_once(rows)
    read = {r[0]: r[1] for r in counted}
    if sum(r[3] for r in counted if r[0]) and _copies(every, rows_of):
        every.unpersist()
        every, counted, clocks = _rollup_once(rows.dropDuplicates(
            [c for c in rows.columns if c not in ("_file", "_fsize")]))
    json_lines = fmt == "json" or (fmt == "auto" and not _has_parquet(history))
    oversized = (_oversized(spark, every, history, since, until, reading) if json_lines
                 else 0)
    written = {"rows_read": sum(read.values()) + oversized,
               "rows_skipped": sum(n for ok, n in read.items() if not ok) + oversized,
               "rows_duplicate": sum(read[r[0]] - r[1] for r in counted if r[0])}
    if written["rows_read"] == written["rows_skipped"]:
        every.unpersist()
        raise NothingToAnalyse(
            f"no usable history rows under {history}"
            + (" in the span asked for" if since is not None or until is not None else "")
            + f" ({written['rows_read']:,} read, {written['rows_skipped']:,} skipped)")
    minutes = every.where(F.col("_ok")).drop("_ok", "_suspect", "_file", "_fsize")
    leaps = skew.leaps(clocks)
    if leaps:   # each stepped clock's rows moved back from its step on, before any figure
        minutes = moved_back(minutes, leaps)
    newest, span = skew.taken_back(clocks, leaps)

    # The driver takes the rollup once, one rpc at a time, computes every table from it
    # (analytics/series.py says why; the per-period tables analytics/periods.py) and
    # writes them itself (analytics/files.py), then draws the report.
    arranged: list[findings.Rpc] = []
    nodes: dict[str, series.Merged] = {}
    recording: set[str] = set()
    big: dict[str, files.TableFile] = {}
    try:
        for name in PERIODS:
            big[name] = files.TableFile(spark, f"{out}/{name}", periods.SCHEMA)
        for rpc in series.stream(minutes, sum(r[6] for r in counted if r[0]),
                                 _part_bytes(spark)):
            for name, seconds in PERIODS.items():
                big[name].add(periods.columns(rpc, seconds, span))
            nodes = series.per_node(rpc, nodes)
            recording |= series.presence(rpc)
            arranged.append(findings.arrange(rpc))
    except BaseException:
        for table in big.values():
            table.abort()
        raise
    written.update((name, table.close()) for name, table in big.items())
    found = findings.tables(arranged, nodes, recording, half_life, newest, span, leaps)
    for name, rows in found.items():
        files.write_table(spark, f"{out}/{name}", rows, findings.SCHEMAS[name])
        written[name] = len(rows)
    doc = findings.weights_doc(found["weights"], {
        "history": history, "since": since, "until": until, "half_life_s": half_life})
    files.write_text(spark, f"{out}/weights.json", json.dumps(doc, indent=1) + "\n")
    if report:
        from rpcbus.analytics import report as report_mod

        report_mod.write(out, report_dir, found, findings.throughput(nodes, span),
                         history={k: written[k] for k in
                                  ("rows_read", "rows_skipped", "rows_duplicate")})
    every.unpersist()
    return written


def _prepared(rows: Any, since: float | None, until: float | None) -> Any:
    """History rows as the rollup takes them: inside [``since``, ``until``), ``_ok``
    (usable: schema version 1 with its keys), ``minute``, ``weight_sum``, ``nrows`` and
    ``local_first`` (1 where the serving node's policy was local-first)."""
    from pyspark.sql import functions as F

    if since is not None:
        rows = rows.where(F.col("window_start") >= since)
    if until is not None:
        rows = rows.where(F.col("window_start") < until)
    ok = ((F.col("schema_version") == 1) & F.col("rpc").isNotNull()
          & F.col("provider").isNotNull() & F.col("calls").isNotNull()
          & F.col("window_start").isNotNull())
    return (rows.withColumn("_ok", F.coalesce(ok, F.lit(False)))
            .withColumn("minute", (F.floor(F.col("window_start") / 60) * 60).cast("long"))
            .withColumn("weight_sum", F.col("weight")).withColumn("nrows", F.lit(1))
            .withColumn("local_first", F.coalesce(
                (F.col("policy") == "local-first").cast("long"), F.lit(0))))


def _copies(every: Any, rows_of: Any) -> bool:
    """Whether a usable row of a minute the rollup ``every`` found suspect is there twice
    (every field alike but the file), compared in one Spark job over the rows of those
    minutes' hours (``rows_of(hours)``: only their ``date=/hour=`` folders, as nodes file
    a window under the hour of its start). Where that finds fewer of those minutes' rows
    than the rollup counted (a history laid out otherwise), over everything."""
    from pyspark.sql import functions as F

    suspect = every.where((F.col("_suspect") > 0) & F.col("_ok"))
    expected, hours = 0, set()
    for hour, n in suspect.groupBy((F.floor(F.col("minute") / 3600) * 3600).cast("long")) \
            .agg(F.sum("nrows")).collect():
        hours.add(int(hour))
        expected += n
    keys = F.broadcast(suspect.select(*KEYS, "minute"))
    for where in (hours, None):
        rows = rows_of(where).where(F.col("_ok")).join(keys, [*KEYS, "minute"], "left_semi")
        alike = rows.groupBy(*(c for c in rows.columns if c not in ("_file", "_fsize"))).count()
        found, most = alike.agg(F.sum("count"), F.max("count")).collect()[0]
        if (found or 0) >= expected:
            break
    return bool(most and most > 1)


def _oversized(spark: Any, every: Any, history: str, since: float | None,
               until: float | None, reading: float) -> int:
    """Lines over ``MAX_LINE`` the reader skipped, counted from what is missing: per file
    whose rows the rollup holds (from that file alone), its size less its rows at the
    history's usual bytes per row (the median file's, x 1.25, at most ``MAX_ROW``); at
    least half ``MAX_LINE`` missing is at
    least one such line. A file of that size with no row at all holds only such lines.
    A line longer than a split of its file (``spark.sql.files.maxPartitionBytes``, 128
    MB) comes out as pieces at the splits' ends, unreadable rows (counted so): a file
    with unreadable rows adds nothing more. (Keeping the raw text of unreadable lines to
    tell the pieces apart cost 10 % of the job at 10M rows.) A lower bound, then: one
    line per file, however many it holds. Files changed since ``reading`` (when the read
    began: nodes still writing the history) are not judged by their size now, which
    their rows read before were never measured against.
    Returns the lines to add to the rows read and skipped; the files are said once."""
    from pyspark.sql import functions as F

    files = (every.where(F.col("_suspect") == 0).groupBy("_file")
             .agg(F.sum("nrows").alias("rows"), F.max("_fsize").alias("size"),
                  F.sum(F.when(~F.col("_ok"), F.col("nrows")).otherwise(0)).alias("bad"))
             .collect())
    usual = [r["size"] / r["rows"] for r in files if r["rows"] >= 100]
    per_row = min(1.25 * float(np.median(usual)) if usual else 2048.0, MAX_ROW)
    flagged = [r for r in files if r["size"] - r["rows"] * per_row >= MAX_LINE / 2]
    sizes = sorted(r["size"] for r in files)
    folders = (hour_folders(spark, history, since, until)
               if since is not None or until is not None else None)
    unseen = 0
    for size in _big_files(spark, [history] if folders is None else folders, reading):
        at = int(np.searchsorted(sizes, size))
        if at < len(sizes) and sizes[at] == size:
            sizes.pop(at)                 # a file with rows, judged above
        else:
            unseen += 1
    lines = sum(1 for r in flagged if not r["bad"])
    if flagged or unseen:
        print(f"  warning: {len(flagged) + unseen:,} history file(s) hold lines over "
              f"{MAX_LINE >> 20} MiB, skipped unread (a node never writes one: a damaged "
              "or foreign file)", flush=True)
    return lines + unseen


def _big_files(spark: Any, paths: list[str], before: float) -> list[int]:
    """The sizes of the files under ``paths`` of ``MAX_LINE`` bytes or more, last changed
    before ``before`` (seconds since the epoch)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out = []
    for path in paths:
        root = jvm.org.apache.hadoop.fs.Path(path)
        fs = root.getFileSystem(conf)
        if not fs.exists(root):
            continue
        found = fs.listFiles(root, True)
        while found.hasNext():
            status = found.next()
            size = status.getLen()
            if size >= MAX_LINE and status.getModificationTime() < before * 1000:
                out.append(int(size))
    return out


def _rollup_once(rows: Any) -> tuple[Any, list[Any], dict[str, dict[int, Any]]]:
    """The per-minute rollup of ``rows`` (persisted); per ``_ok``: rows, newest minute,
    minutes whose rows came from more than one file, first window start, last window
    end, rollup rows; and per serving node and minute of its usable rows (calls, first
    window start, last window end: its clock, analytics/skew.py ``leaps``). One job."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # ``recorded``: a row carries ``provider_peak_in_flight`` (nodes since 0.2, which also
    # write presence rows), so its node's providers are present exactly in the minutes
    # they have rows, even where no minute of a busy cluster is wholly idle
    recorded = F.max(F.col("provider_peak_in_flight").isNotNull().cast("long"))
    every = rollup(rows, [*KEYS, "minute", "_ok"], [recorded.alias("recorded")],
                   raw=True).persist(
        StorageLevel.MEMORY_AND_DISK)
    ok = F.col("_ok")
    by_node = every.groupBy("_ok", F.when(ok, F.col("served_by")).alias("node"),
                            F.when(ok, F.col("minute")).alias("at")).agg(
        F.sum("nrows"), F.max("minute"), F.sum("_suspect"), F.min("window_start"),
        F.max("window_end"), F.count("*"), F.sum("calls")).collect()
    counted: list[list[Any]] = []
    clocks: dict[str, dict[int, Any]] = {}
    for good in (True, False):
        mine = [r for r in by_node if r[0] == good]
        if mine:
            counted.append([good, sum(r[3] for r in mine), max(r[4] for r in mine),
                            sum(r[5] for r in mine), min(r[6] for r in mine),
                            max(r[7] for r in mine), sum(r[8] for r in mine)])
    for r in by_node:
        if r[0] and r[1] is not None:
            clocks.setdefault(r[1], {})[int(r[2])] = (float(r[9] or 0), r[6], r[7])
    return every, counted, clocks


def _part_bytes(spark: Any) -> int:
    """How much of the rollup the driver takes at a time (series.stream): 64 MB, or a
    quarter of ``spark.driver.maxResultSize`` (1g unless set; 0: no limit) if less."""
    limit = spark.sparkContext._jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(
        spark.sparkContext.getConf().get("spark.driver.maxResultSize", "1g"))
    return min(PART_BYTES, limit // 4) if limit > 0 else PART_BYTES


class _Progress:
    """Prints Spark's active stages and their tasks done while the job runs."""

    def __init__(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(1.0):
            done = total = stages = 0
            for sid in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(sid)
                if info is not None:
                    stages += 1
                    done += info.numCompletedTasks
                    total += info.numTasks
            line = (f"{stages} stage(s) running, {done}/{total} tasks" if stages
                    else "working")
            print(f"\r  {time.monotonic() - t0:6.1f} s  {line}" + " " * 10, end="", flush=True)

    def __enter__(self) -> "_Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        print()


def run(history: str, out: str, since: str | None = None, until: str | None = None,
        master: str | None = None, half_life: float = 3600.0, fmt: str = "auto",
        report: bool = True, report_dir: str | None = None) -> dict[str, int]:
    """The whole job (``rpcbus analyze``, analytics/commands.py, says what each argument
    means): a Spark session, the tables, weights and report, a summary on stdout; returns
    the rows written per table. Spark's own log goes to a file (analytics/sparklog.py);
    its errors raise ``Failed`` (one line naming that file) after the session is
    stopped."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from rpcbus.analytics import sparklog

    started = time.monotonic()
    if report:   # the report's charts: imported while the JVM starts, not after the job
        threading.Thread(target=_import_charts, daemon=True).start()
    log_path, log_conf = sparklog.to_file()
    with sparklog.jvm_stderr_to(log_path):
        spark = session(master, log_conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with _Progress(spark):
            written = analyze(spark, history, out, _instant(since), _instant(until),
                              half_life, fmt, report, report_dir)
    except (PySparkException, Py4JJavaError) as exc:   # said while the JVM that holds
        sparklog.add(log_path, f"rpcbus analyze stopped on: {exc}")   # its text runs
        kept = sparklog.kept(log_path)
        raise Failed(_spark_error(exc, history)
                     + (f" (Spark's log: {log_path})" if kept else "")) from None
    finally:
        stop(spark)
    if sparklog.kept(log_path):
        print(f"  Spark's warnings and errors -> {log_path}")
    print(f"  {written.pop('rows_read'):,} history rows read, "
          f"{written.pop('rows_skipped'):,} skipped (other schema version, unreadable or "
          f"over {MAX_LINE >> 20} MiB), "
          f"{written.pop('rows_duplicate'):,} duplicates left out")
    for name, n in written.items():
        print(f"  {name}: {n:,} rows -> {out}/{name}")
    print(f"  weights for rpc.weights_file -> {out}/weights.json")
    if report:
        print(f"  report -> {report_dir or os.path.join(out, 'report')}/report.html")
    print(f"done in {time.monotonic() - started:.1f} s")
    return written


def _import_charts() -> None:
    """Import matplotlib for the report (analytics/report.py), headless: about 1.5 s that
    otherwise falls on the job's end. Errors are left for the report to raise."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401  (loaded, for report.write)
    except Exception:   # the report imports it again and says what is wrong
        pass


class Failed(Exception):
    """The job could not run; the message says why in one line (and what to do)."""


class NothingToAnalyse(Exception):
    """The history (in the span asked for) holds no row the job can use."""


def _spark_error(exc: Exception, history: str) -> str:
    condition = getattr(exc, "getCondition", getattr(exc, "getErrorClass", lambda: None))()
    if condition == "PATH_NOT_FOUND":
        return f"no history at {history}: give the nodes' history directory (history.dir)"
    java = getattr(exc, "java_exception", None)   # a failed job: SparkException's text
    while (java is not None and java.getCause() is not None
           and str(java.getMessage() or "").startswith("Exception thrown in awaitResult")):
        java = java.getCause()      # what another thread's job (a prefetch) failed with
    text = str((java.getMessage() or java.toString()) if java is not None else exc)
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    if "OutOfMemoryError" in text or "Java heap space" in text:
        first += " (give the driver more memory: SPARK_DRIVER_MEMORY=8g, docs/history.md)"
    return f"Spark failed: {first}"


def _instant(text: str | None) -> float | None:
    if not text:
        return None
    from datetime import datetime, timezone

    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


if __name__ == "__main__":     # under spark-submit (the module docstring)
    from rpcbus.analytics.commands import analyze as command

    command(prog_name="analysis.py")
