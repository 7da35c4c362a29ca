"""Episodes: the stretches of minutes in which a provider was slow or failing against the
other providers of its rpc in the same minutes (PySpark; docs/history.md has the rules).

Minute by minute, per rpc and provider (all serving nodes together), against the median
of the rpc's *other* providers that minute:

- **slow**: its mean latency (over at least ``MIN_SAMPLED`` sampled calls) is over
  ``findings.SLOW_FACTOR`` times the others' median mean latency;
- **failing**: at least ``MIN_FAILED`` calls failed (errors and timeouts), and its failure
  rate is at least ``findings.FAIL_MARGIN`` above and ``findings.FAIL_FACTOR`` times the
  others' median.

Bad minutes at most ``GAP`` minutes apart form one episode (a quiet or borderline minute
inside does not end it); an episode of fewer than ``MIN_MINUTES`` bad minutes is noise
and left out. Each episode says when (``start``, ``end``: the end of its last bad
minute), how long, how bad (``value``: its mean latency or failure rate over the bad
minutes, ``peers_value``: the median of the others' figure over them, ``factor``), the
calls it touched (``affected``: every call of a slow episode, the failed calls over the
peers' rate of a failing one) and whether it was still going at the end of the history
(``ongoing``: its last bad minute within ``GAP`` minutes of the newest).
"""

from __future__ import annotations

from typing import Any

GAP = 2            # minutes: bad minutes this close are one episode
MIN_MINUTES = 3    # bad minutes an episode needs
MIN_SAMPLED = 3    # sampled calls a minute needs to be judged slow
MIN_FAILED = 3     # failed calls a minute needs to be judged failing


def _median(values: str) -> str:
    """SQL: the median of an array expression of doubles (nulls left out; null if none),
    as Spark's ``percentile(x, 0.5)`` gives it (the middle two averaged)."""
    a = f"array_sort(filter({values}, v -> v IS NOT NULL))"
    return (f"CASE WHEN size({a}) = 0 THEN NULL WHEN size({a}) % 2 = 1 "
            f"THEN element_at({a}, int(size({a}) / 2) + 1) "
            f"ELSE (element_at({a}, int(size({a}) / 2)) "
            f"+ element_at({a}, int(size({a}) / 2) + 1)) / 2 END")


def minutes_against_peers(minutes: Any) -> Any:
    """Per rpc, provider and minute: calls, failed, mean latency and failure rate, and the
    median of each over the rpc's other providers with calls that minute."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    failed = F.col("errors") + F.col("ack_timeouts") + F.col("response_timeouts")
    per = (minutes.groupBy("rpc", "provider", "minute")
           .agg(F.sum("calls").alias("calls"), F.sum(failed).alias("failed"),
                F.sum("latency_sum_s").alias("lat_sum"),
                F.sum("latency_sampled").alias("sampled"))
           .withColumn("latency_s", F.when(F.col("sampled") > 0,
                                           F.col("lat_sum") / F.col("sampled")))
           .withColumn("failure_rate", F.when(F.col("calls") > 0,
                                              F.col("failed") / F.col("calls"))))
    everyone = F.collect_list(F.struct("provider", "latency_s", "failure_rate")).over(
        Window.partitionBy("rpc", "minute"))
    others = "filter(_all, x -> x.provider != provider)"
    return (per.withColumn("_all", everyone)
            .withColumn("peers_latency_s", F.expr(_median(f"transform({others}, "
                                                          "x -> x.latency_s)")))
            .withColumn("peers_failure_rate", F.expr(_median(f"transform({others}, "
                                                             "x -> x.failure_rate)")))
            .drop("_all"))


def episodes(against: Any, newest: int) -> Any:
    """The episodes table from ``minutes_against_peers``; ``newest``: the history's newest
    minute (``ongoing``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from rpcbus.analytics.findings import FAIL_FACTOR, FAIL_MARGIN, SLOW_FACTOR

    slow = ((F.col("sampled") >= MIN_SAMPLED) & (F.col("peers_latency_s") > 0)
            & (F.col("latency_s") > SLOW_FACTOR * F.col("peers_latency_s")))
    failing = ((F.col("failed") >= MIN_FAILED) & F.col("peers_failure_rate").isNotNull()
               & (F.col("failure_rate") >= F.col("peers_failure_rate") + FAIL_MARGIN)
               & (F.col("failure_rate") >= FAIL_FACTOR * F.col("peers_failure_rate")))
    bad = (against.where(slow).withColumn("kind", F.lit("slow"))
           .unionByName(against.where(failing).withColumn("kind", F.lit("failing"))))
    order = Window.partitionBy("rpc", "provider", "kind").orderBy("minute")
    starts = F.coalesce(F.col("minute") - F.lag("minute").over(order) > 60 * GAP + 60,
                        F.lit(True))
    bad = bad.withColumn("episode", F.sum(starts.cast("int")).over(order))
    slow_kind = F.col("kind") == "slow"
    table = bad.groupBy("rpc", "provider", "kind", "episode").agg(
        F.min("minute").alias("start"), (F.max("minute") + 60).alias("end"),
        F.count(F.lit(1)).alias("bad_minutes"), F.sum("calls").alias("calls"),
        F.sum("failed").alias("failed"), F.sum("lat_sum").alias("lat_sum"),
        F.sum("sampled").alias("sampled"),
        F.expr("percentile(CASE WHEN kind = 'slow' THEN peers_latency_s "
               "ELSE peers_failure_rate END, 0.5)").alias("peers_value"))
    value = F.when(slow_kind, F.col("lat_sum") / F.col("sampled")).otherwise(
        F.col("failed") / F.col("calls"))
    return (table.where(F.col("bad_minutes") >= MIN_MINUTES)
            .withColumn("value", value)
            .withColumn("factor", F.try_divide(F.col("value"), F.col("peers_value")))
            .withColumn("affected", F.when(slow_kind, F.col("calls")).otherwise(F.greatest(
                F.lit(0.0), F.col("failed") - F.col("peers_value") * F.col("calls"))))
            .withColumn("ongoing", F.col("end") - 60 >= newest - 60 * GAP)
            .select("rpc", "provider", "kind", "start", "end",
                    ((F.col("end") - F.col("start")) / 60).cast("long").alias("minutes"),
                    "bad_minutes", "calls", "failed", "value", "peers_value", "factor",
                    "affected", "ongoing"))
