"""What ``rpcbus analyze`` concludes from the history: fairness, outliers, hot rpcs, peak
minutes and recommended weights (PySpark; docs/history.md has every rule in words).

- ``fairness``: per rpc and provider, the calls it got against the calls its weight
  should have given it. Minute by minute, a provider present (from its first to its
  last minute with any row for the rpc) expects the rpc's calls of that minute times
  its weight over the weights of every provider present; summed over the span that
  is ``expected_calls``. ``ratio`` = calls / expected; per rpc the spread of the
  ratios: ``cv`` (standard deviation over mean) and ``max_over_mean``. Flagged
  (``took`` "more" or "less") when the ratio is off by more than ``FAIR_TOLERANCE``
  and by more than ``FAIR_Z`` standard deviations of a weighted random choice. A
  provider that took less while others of its rpc took more names them (``because_of``):
  the report names the cause once.
- ``outliers``: a provider whose p99 is over ``SLOW_FACTOR`` times the median p99 of
  the rpc's other providers (``kind`` "slow"), or whose failure rate (errors and
  timeouts over calls) is at least ``FAIL_MARGIN`` above and ``FAIL_FACTOR`` times
  the others' median (``kind`` "failing").
- ``hot_rpcs``: every rpc ranked by calls, with its share and its busiest minute;
  ``hot`` when its share is over an even share and at least ``HOT_FACTOR`` times the
  median share of the other rpcs (with two rpcs at 97 % / 3 % the first is hot; an
  even share alone never fires with two rpcs). An rpc alone is never hot.
- ``peak_minutes``: the ``PEAKS`` busiest minutes of each rpc, and of all rpcs together
  (rpc ``*``).
- ``weights``: a recommended weight per rpc and provider, from recent behaviour (each
  minute counts ``0.5 ** (age / half_life)``, age from the newest minute):
  the score ``(1 - failure rate) ** 4 * min(1, others' median mean latency / own mean
  latency)`` over the best score of the rpc's providers (the best weighs 1), at least
  ``MIN_WEIGHT``, rounded to 3 decimals. ``weights.json`` is what
  ``rpc.weights_file`` loads (broker/weights.py).
"""

from __future__ import annotations

import time
from typing import Any

from rpcbus.analytics.analysis import aggregate

FAIR_TOLERANCE = 0.10   # |ratio - 1| above this ...
FAIR_Z = 4.0            # ... and |calls - expected| above this many sqrt(expected)
SLOW_FACTOR = 3.0
FAIL_MARGIN = 0.05
FAIL_FACTOR = 3.0
PEAKS = 3
HOT_FACTOR = 3.0
MIN_WEIGHT = 0.05
FAILURE_POWER = 4


def tables(minutes: Any, per_provider: Any, half_life: float, newest: int) -> dict[str, Any]:
    """The findings tables from the per-minute rollup of the history (analytics/analysis.py
    ``rollup``: a ``minute`` column and summed counters), the span-wide ``per_provider``
    and the ``newest`` minute (the weights' decay counts back from it)."""
    per_rpc_minute = aggregate(minutes, ["rpc", "minute"])
    return {"fairness": fairness(minutes), "outliers": outliers(per_provider),
            "hot_rpcs": hot_rpcs(minutes, per_rpc_minute),
            "peak_minutes": peak_minutes(minutes, per_rpc_minute),
            "weights": weights(minutes, half_life, newest)}


def _others_median(table: Any, columns: dict[str, str]) -> Any:
    """Per rpc and provider of ``table``: the exact median of each column over the rpc's
    *other* providers (``columns``: column -> name of its median), and ``peers``. A
    provider alone on its rpc has no row."""
    from pyspark.sql import functions as F

    peers = table.select("rpc", F.col("provider").alias("_peer"),
                         *[F.col(c).alias(f"_{c}") for c in columns])
    return (table.select("rpc", "provider").join(peers, "rpc")
            .where(F.col("provider") != F.col("_peer")).groupBy("rpc", "provider")
            .agg(*[F.expr(f"percentile(_{c}, 0.5)").alias(median)
                   for c, median in columns.items()], F.count("_peer").alias("peers")))


def fairness(minutes: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_min = (minutes.groupBy("rpc", "provider", "minute")
               .agg(F.sum("calls").alias("calls"),
                    (F.sum("weight_sum") / F.sum("nrows")).alias("w")))
    span = per_min.groupBy("rpc", "provider").agg(
        F.min("minute").alias("first"), F.max("minute").alias("last"),
        F.avg("w").alias("w_avg"), F.sum("calls").alias("calls"))
    rpc_min = per_min.groupBy("rpc", "minute").agg(F.sum("calls").alias("rpc_calls"))
    present = (span.select("rpc", "provider", "first", "last", "w_avg").join(rpc_min, "rpc")
               .where(F.col("minute").between(F.col("first"), F.col("last")))
               .join(per_min.select("rpc", "provider", "minute", "w"),
                     ["rpc", "provider", "minute"], "left")
               .withColumn("w", F.coalesce("w", "w_avg")))
    present = present.withColumn("expected", F.try_divide(
        F.col("rpc_calls") * F.col("w"), F.sum("w").over(Window.partitionBy("rpc", "minute"))))
    expected = present.groupBy("rpc", "provider").agg(
        F.sum("expected").alias("expected_calls"))
    by_rpc = Window.partitionBy("rpc")
    table = (span.join(expected, ["rpc", "provider"])
             .withColumn("rpc_calls", F.sum("calls").over(by_rpc))
             .withColumn("share", F.try_divide("calls", "rpc_calls"))
             .withColumn("expected_share", F.try_divide("expected_calls", "rpc_calls"))
             .withColumn("ratio", F.when(F.col("expected_calls") > 0,
                                         F.col("calls") / F.col("expected_calls"))))
    mean = F.avg("ratio").over(by_rpc)
    table = (table.withColumn("cv", F.try_divide(F.stddev_pop("ratio").over(by_rpc), mean))
             .withColumn("max_over_mean", F.try_divide(F.max("ratio").over(by_rpc), mean))
             .withColumn("providers", F.count("provider").over(by_rpc)))
    off = F.abs(F.col("calls") - F.col("expected_calls"))
    flagged = ((F.abs(F.col("ratio") - 1) > FAIR_TOLERANCE)
               & (off > FAIR_Z * F.sqrt(F.col("expected_calls"))))
    took = F.when(flagged & (F.col("ratio") > 1), F.lit("more")).when(flagged, F.lit("less"))
    table = table.withColumn("took", took)
    # A provider that took less while another of the rpc took more lost its calls to it:
    # the cause is named once (``because_of``: the providers that took more).
    more = F.array_join(F.sort_array(F.collect_set(
        F.when(F.col("took") == "more", F.col("provider"))).over(by_rpc)), ",")
    return table.select(
        "rpc", "provider", "calls", "rpc_calls", "expected_calls", "share", "expected_share",
        "ratio", F.col("w_avg").alias("weight"), "providers", "cv", "max_over_mean", "took",
        F.when((F.col("took") == "less") & (more != ""), more).alias("because_of"))


def outliers(per_provider: Any) -> Any:
    from pyspark.sql import functions as F

    joined = (per_provider.select("rpc", "provider", "calls", "p99_s", "failure_rate")
              .join(_others_median(per_provider, {"p99_s": "peers_p99_s",
                                                  "failure_rate": "peers_failure_rate"}),
                    ["rpc", "provider"]))
    slow = (joined.where((F.col("peers_p99_s") > 0)
                         & (F.col("p99_s") > SLOW_FACTOR * F.col("peers_p99_s")))
            .select("rpc", "provider", "calls", "peers", F.lit("slow").alias("kind"),
                    F.col("p99_s").alias("value"), F.col("peers_p99_s").alias("peers_median")))
    failing = (joined.where((F.col("failure_rate") >= F.col("peers_failure_rate") + FAIL_MARGIN)
                            & (F.col("failure_rate")
                               >= FAIL_FACTOR * F.col("peers_failure_rate")))
               .select("rpc", "provider", "calls", "peers", F.lit("failing").alias("kind"),
                       F.col("failure_rate").alias("value"),
                       F.col("peers_failure_rate").alias("peers_median")))
    return slow.unionByName(failing)


def hot_rpcs(minutes: Any, per_rpc_minute: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    table = (aggregate(minutes, ["rpc"], extra=[F.countDistinct("provider").alias("providers")])
             .withColumnRenamed("window_start", "first_window")
             .withColumnRenamed("window_end", "last_window"))
    busiest = per_rpc_minute.groupBy("rpc").agg(F.max("calls").alias("peak_minute_calls"))
    everything = Window.partitionBy()
    table = (table.join(busiest, "rpc")
             .withColumn("share", F.try_divide("calls", F.sum("calls").over(everything)))
             .withColumn("rpcs", F.count("rpc").over(everything)))
    shares = table.select(F.col("rpc").alias("_other"), F.col("share").alias("_share"))
    others = (table.select("rpc").join(shares, F.col("rpc") != F.col("_other"))
              .groupBy("rpc").agg(F.expr("percentile(_share, 0.5)")
                                  .alias("others_median_share")))
    hot = ((F.col("share") > 1.0 / F.col("rpcs"))
           & (F.col("share") >= HOT_FACTOR * F.col("others_median_share")))
    return (table.join(others, "rpc", "left")
            .withColumn("hot", F.coalesce(hot, F.lit(False)))
            .withColumn("calls_per_s", F.try_divide(
                "calls", F.col("last_window") - F.col("first_window")))
            .withColumn("peak_minute_calls_per_s", F.col("peak_minute_calls") / 60.0)
            .withColumn("rank", F.row_number().over(everything.orderBy(F.desc("calls"),
                                                                       "rpc"))))


def peak_minutes(minutes: Any, per_rpc_minute: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    overall = aggregate(minutes.withColumn("rpc", F.lit("*")), ["rpc", "minute"])
    both = per_rpc_minute.unionByName(overall)
    rank = F.row_number().over(Window.partitionBy("rpc").orderBy(F.desc("calls"), "minute"))
    return (both.withColumn("rank", rank).where(F.col("rank") <= PEAKS)
            .select("rpc", "rank", "minute", "calls", (F.col("calls") / 60.0)
                    .alias("calls_per_s"), "failure_rate", "p50_s", "p99_s"))


def weights(minutes: Any, half_life: float, newest: int) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    decay = F.pow(F.lit(0.5), (F.lit(newest) - F.col("minute")) / F.lit(half_life))
    failed = F.col("errors") + F.col("ack_timeouts") + F.col("response_timeouts")
    recent = minutes.groupBy("rpc", "provider").agg(
        F.sum("calls").alias("calls"),
        F.sum(decay * F.col("calls")).alias("d_calls"),
        F.sum(decay * failed).alias("d_failed"),
        F.sum(decay * F.coalesce("latency_sum_s", F.lit(0.0))).alias("d_lat_sum"),
        F.sum(decay * F.coalesce("latency_sampled", F.lit(0))).alias("d_sampled"))
    recent = (recent.withColumn("recent_failure_rate", F.when(
                  F.col("d_calls") > 0, F.col("d_failed") / F.col("d_calls")).otherwise(0.0))
              .withColumn("recent_latency_s", F.when(
                  F.col("d_sampled") > 0, F.col("d_lat_sum") / F.col("d_sampled"))))
    table = recent.join(_others_median(recent, {"recent_latency_s": "peers_latency_s"}),
                        ["rpc", "provider"], "left")
    speed = F.when((F.col("recent_latency_s") > 0) & F.col("peers_latency_s").isNotNull(),
                   F.least(F.lit(1.0), F.col("peers_latency_s") / F.col("recent_latency_s"))
                   ).otherwise(1.0)
    score = F.pow(1.0 - F.col("recent_failure_rate"), float(FAILURE_POWER)) * speed
    best = F.max("score").over(Window.partitionBy("rpc"))
    return (table.withColumn("speed", speed).withColumn("score", score)
            .withColumn("weight", F.greatest(F.lit(MIN_WEIGHT), F.round(
                F.when(best > 0, F.col("score") / best).otherwise(0.0), 3)))
            .select("rpc", "provider", "calls", "recent_failure_rate", "recent_latency_s",
                    "peers_latency_s", "speed", "score", "weight"))


def weights_doc(table: Any, source: dict[str, Any]) -> dict[str, Any]:
    """The ``weights`` table as the document nodes load (``rpc.weights_file``)."""
    rpcs: dict[str, dict[str, float]] = {}
    for r in table.collect():
        rpcs.setdefault(r["rpc"], {})[r["provider"]] = r["weight"]
    return {"schema_version": 1,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": source, "default": 1.0,
            "rpcs": {rpc: dict(sorted(named.items())) for rpc, named in sorted(rpcs.items())}}
