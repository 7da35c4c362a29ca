"""What ``rpcbus analyze`` concludes from the history: fairness, outliers, episodes
(analytics/episodes.py), hot rpcs, peak minutes, recommended weights and clock skew
(analytics/skew.py) (PySpark; docs/history.md has every rule in words).

- ``fairness``: per rpc and provider, the calls it got against the calls its weight
  should have given it. Minute by minute, a provider present (from its first to its
  last minute with any row for the rpc; exactly the minutes with a row on a node that
  writes presence rows) expects the rpc's calls of that minute times
  its weight over the weights of every provider present; summed over the span that
  is ``expected_calls``. ``ratio`` = calls / expected; per rpc the spread of the
  ratios: ``cv`` (standard deviation over mean) and ``max_over_mean``. Flagged
  (``took`` "more" or "less") when the ratio is off by more than ``FAIR_TOLERANCE``
  and by more than ``FAIR_Z`` standard deviations of a weighted random choice. A
  provider that took less while others of its rpc took more names them (``because_of``):
  the report names the cause once. ``present_minutes`` / ``idle_minutes`` show starvation.
- ``outliers``: a provider whose p99 is over ``SLOW_FACTOR`` times the median p99 of
  the rpc's other providers (``kind`` "slow"), or whose failure rate (errors and
  timeouts over calls) is at least ``FAIL_MARGIN`` above and ``FAIL_FACTOR`` times
  the others' median (``kind`` "failing").
- ``hot_rpcs``: every rpc ranked by calls, with its share and its busiest minute;
  ``hot`` when its share is over an even share and at least ``HOT_FACTOR`` times the
  median share of the other rpcs (with two rpcs at 97 % / 3 % the first is hot; an
  even share alone never fires with two rpcs). An rpc alone is never hot.
- ``peak_minutes``: the ``PEAKS`` busiest minutes (by rate: a partial minute counts its
  real span) of each rpc, and of all rpcs together (rpc ``*``).
- ``weights``: a recommended weight per rpc and provider, from the recent state (each
  minute counts ``0.5 ** (age / half_life)``, age from the newest minute; the minutes up
  to an episode that ended ``RECOVERED`` minutes before no longer count): the score
  ``(1 - excess failure rate) ** 4 * min(1, LATENCY_BAND * others' median mean latency
  / own mean latency)`` (excess: over the others' median and ``FAILURE_NOISE``) over the
  best score of the rpc's providers (the best weighs 1), at least ``MIN_WEIGHT``,
  rounded to 3 decimals. ``weights.json`` is what ``rpc.weights_file`` loads
  (broker/weights.py).
- ``clock_skew``: nodes whose clocks look off (analytics/skew.py).
"""

from __future__ import annotations

import time
from typing import Any

from rpcbus.analytics import episodes as episodes_mod
from rpcbus.analytics.rollup import aggregate, calls_per_s

FAIR_TOLERANCE = 0.10   # |ratio - 1| above this ...
FAIR_Z = 4.0            # ... and |calls - expected| above this many sqrt(expected)
SLOW_FACTOR = 3.0
FAIL_MARGIN = 0.05
FAIL_FACTOR = 3.0
PEAKS = 3
HOT_FACTOR = 3.0
MIN_WEIGHT = 0.05
FAILURE_POWER = 4
LATENCY_BAND = 2.0   # a mean latency up to this many times the peers' does not lower a weight
FAILURE_NOISE = 0.01  # nor does a failure rate up to this much over the peers' median
RECOVERED = 10       # minutes after an episode ended: its minutes no longer weigh


def tables(minutes: Any, per_provider: Any, half_life: float, newest: int,
           span: tuple[float, float]) -> dict[str, Any]:
    """The findings tables from the per-minute rollup of the history (analytics/analysis.py
    ``rollup``: a ``minute`` column and summed counters), the span-wide ``per_provider``,
    the ``newest`` minute (the weights' decay counts back from it) and the history's
    ``span`` (first window start, last window end: partial minutes' rates)."""
    # Tables two findings read are computed once, up front (``localCheckpoint``): their
    # queries then read a small result instead of planning and running it again.
    per_rpc_minute = aggregate(minutes, ["rpc", "minute"]).withColumn(
        "calls_per_s", calls_per_s("minute", 60, span)).localCheckpoint()
    found = episodes_mod.episodes(episodes_mod.minutes_against_peers(minutes),
                                  newest).localCheckpoint()
    return {"fairness": fairness(minutes), "outliers": outliers(per_provider),
            "episodes": found, "hot_rpcs": hot_rpcs(minutes, per_rpc_minute, per_provider),
            "peak_minutes": peak_minutes(minutes, per_rpc_minute, span),
            "weights": weights(minutes, half_life, newest, found),
            "clock_skew": clock_skew(minutes)}


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

    # A node that records presence writes a row (no calls, peak_in_flight 0) per window
    # for every provider connected to it: its providers are present exactly in the minutes
    # they have a row. Elsewhere (older nodes), from the first to the last minute with one.
    recording = (minutes.where((F.col("calls") == 0) & (F.col("peak_in_flight") == 0))
                 .select("served_by").distinct().withColumn("_exact", F.lit(True)))
    per_min = (minutes.join(F.broadcast(recording), "served_by", "left")
               .groupBy("rpc", "provider", "minute")
               .agg(F.sum("calls").alias("calls"),
                    (F.sum("weight_sum") / F.sum("nrows")).alias("w"),
                    F.max(F.coalesce("_exact", F.lit(False))).alias("exact")))
    span = per_min.groupBy("rpc", "provider").agg(
        F.min("minute").alias("first"), F.max("minute").alias("last"),
        F.avg("w").alias("w_avg"), F.sum("calls").alias("calls"),
        F.max("exact").alias("exact"))
    rpc_min = per_min.groupBy("rpc", "minute").agg(F.sum("calls").alias("rpc_calls"))
    present = (span.select("rpc", "provider", "first", "last", "w_avg", "exact")
               .join(rpc_min, "rpc")
               .where(F.col("minute").between(F.col("first"), F.col("last")))
               .join(per_min.select("rpc", "provider", "minute", "w",
                                    F.col("calls").alias("own")),
                     ["rpc", "provider", "minute"], "left")
               .where(~F.col("exact") | F.col("w").isNotNull())
               .withColumn("w", F.coalesce("w", "w_avg")))
    present = present.withColumn("expected", F.try_divide(
        F.col("rpc_calls") * F.col("w"), F.sum("w").over(Window.partitionBy("rpc", "minute"))))
    expected = present.groupBy("rpc", "provider").agg(
        F.sum("expected").alias("expected_calls"),
        F.count(F.lit(1)).alias("present_minutes"),
        F.sum(F.when(F.coalesce("own", F.lit(0)) == 0, 1).otherwise(0)).alias("idle_minutes"))
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
        "ratio", F.col("w_avg").alias("weight"), "providers", "cv", "max_over_mean",
        "present_minutes", "idle_minutes", "took",
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


def hot_rpcs(minutes: Any, per_rpc_minute: Any, per_provider: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # providers counted from per_provider: a distinct count among the sums would make
    # Spark plan the whole aggregation twice over (seconds on any history)
    providers = per_provider.groupBy("rpc").agg(F.count(F.lit(1)).alias("providers"))
    table = (aggregate(minutes, ["rpc"]).join(providers, "rpc")
             .withColumnRenamed("window_start", "first_window")
             .withColumnRenamed("window_end", "last_window"))
    busiest = per_rpc_minute.groupBy("rpc").agg(
        F.max("calls").alias("peak_minute_calls"),
        F.max("calls_per_s").alias("peak_minute_calls_per_s"))
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
            .withColumn("rank", F.row_number().over(everything.orderBy(F.desc("calls"),
                                                                       "rpc"))))


def peak_minutes(minutes: Any, per_rpc_minute: Any, span: tuple[float, float]) -> Any:
    """The busiest minutes by rate (a partial first or last minute counts its real span)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    overall = aggregate(minutes.withColumn("rpc", F.lit("*")), ["rpc", "minute"]).withColumn(
        "calls_per_s", calls_per_s("minute", 60, span))
    both = per_rpc_minute.unionByName(overall)
    rank = F.row_number().over(Window.partitionBy("rpc").orderBy(
        F.desc_nulls_last("calls_per_s"), F.desc("calls"), "minute"))
    return (both.withColumn("rank", rank).where(F.col("rank") <= PEAKS)
            .select("rpc", "rank", "minute", "calls", "calls_per_s", "failure_rate",
                    "p50_s", "p99_s"))


def weights(minutes: Any, half_life: float, newest: int, found: Any) -> Any:
    """Recommended weights from the recent state: minutes decay with ``half_life``, and
    the minutes up to the end of an episode (``found``) that ended ``RECOVERED`` minutes or
    more before ``newest`` no longer count (the provider recovered); a mean latency within
    ``LATENCY_BAND`` times the peers' does not lower the weight (a difference inside the
    histogram's resolution is noise)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    healed = (found.where(F.col("end") - 60 <= newest - 60 * RECOVERED)
              .groupBy("rpc", "provider").agg(F.max("end").alias("since")))
    minutes = (minutes.join(healed, ["rpc", "provider"], "left")
               .where(F.col("since").isNull() | (F.col("minute") >= F.col("since"))))
    decay = F.pow(F.lit(0.5), (F.lit(newest) - F.col("minute")) / F.lit(half_life))
    failed = F.col("errors") + F.col("ack_timeouts") + F.col("response_timeouts")
    recent = minutes.groupBy("rpc", "provider").agg(
        F.sum("calls").alias("calls"), F.min("since").alias("recovered_at"),
        F.sum(decay * F.col("calls")).alias("d_calls"),
        F.sum(decay * failed).alias("d_failed"),
        F.sum(decay * F.coalesce("latency_sum_s", F.lit(0.0))).alias("d_lat_sum"),
        F.sum(decay * F.coalesce("latency_sampled", F.lit(0))).alias("d_sampled"),
        (F.sum("weight_sum") / F.sum("nrows")).alias("current"))
    recent = (recent.withColumn("recent_failure_rate", F.when(   # null: no recent call
                  F.col("d_calls") > 0, F.col("d_failed") / F.col("d_calls")))
              .withColumn("recent_latency_s", F.when(
                  F.col("d_sampled") > 0, F.col("d_lat_sum") / F.col("d_sampled"))))
    table = recent.join(_others_median(recent, {"recent_latency_s": "peers_latency_s",
                                                "recent_failure_rate": "peers_failure_rate"}),
                        ["rpc", "provider"], "left")
    # failures count over the peers' rate (what every provider of the rpc fails, bad input
    # say, is no reason to move calls) and over FAILURE_NOISE more (nor is noise)
    excess = F.greatest(F.lit(0.0), F.coalesce("recent_failure_rate", F.lit(0.0))
                        - F.coalesce("peers_failure_rate", F.lit(0.0)) - FAILURE_NOISE)
    speed = F.when((F.col("recent_latency_s") > 0) & F.col("peers_latency_s").isNotNull(),
                   F.least(F.lit(1.0), LATENCY_BAND * F.col("peers_latency_s")
                           / F.col("recent_latency_s"))).otherwise(1.0)
    score = F.pow(1.0 - excess, float(FAILURE_POWER)) * speed
    best = F.max("score").over(Window.partitionBy("rpc"))
    return (table.withColumn("speed", speed).withColumn("score", score)
            .withColumn("weight", F.greatest(F.lit(MIN_WEIGHT), F.round(
                F.when(best > 0, F.col("score") / best).otherwise(0.0), 3)))
            .select("rpc", "provider", "calls", "recent_failure_rate", "peers_failure_rate",
                    "recent_latency_s", "peers_latency_s", "speed", "score", "weight",
                    "current", "recovered_at"))


SKEW_SCHEMA = ("node STRING, offset_s DOUBLE, method STRING, relative_to STRING, "
               "correlation DOUBLE, first_window DOUBLE, last_window DOUBLE")


def clock_skew(minutes: Any) -> Any:
    """The ``clock_skew`` table (analytics/skew.py) from each serving node's calls per
    minute and its first and last window (collected: nodes x minutes rows)."""
    from pyspark.sql import functions as F

    from rpcbus.analytics import skew

    nodes: dict[str, dict[str, Any]] = {}
    for r in minutes.groupBy("served_by", "minute").agg(
            F.sum("calls"), F.min("window_start"), F.max("window_end")).collect():
        node = nodes.setdefault(r[0], {"first": r[3], "last": r[4], "calls": {}})
        node["calls"][r[1]] = r[2]
        node["first"], node["last"] = min(node["first"], r[3]), max(node["last"], r[4])
    found = [(f["node"], f["offset_s"], f["method"], f["relative_to"], f["correlation"],
              nodes[f["node"]]["first"], nodes[f["node"]]["last"]) for f in skew.find(nodes)]
    return minutes.sparkSession.createDataFrame(found, SKEW_SCHEMA)


def weights_doc(table: Any, source: dict[str, Any]) -> dict[str, Any]:
    """The ``weights`` table as the document nodes load (``rpc.weights_file``)."""
    rpcs: dict[str, dict[str, float]] = {}
    for r in table.collect():
        rpcs.setdefault(r["rpc"], {})[r["provider"]] = r["weight"]
    return {"schema_version": 1,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": source, "default": 1.0,
            "rpcs": {rpc: dict(sorted(named.items())) for rpc, named in sorted(rpcs.items())}}
