"""The driver-side arithmetic of the analysis (analytics/series.py) against brute force:
the median of the *other* providers' values, the interpolated histogram percentiles,
and the merging of series minute by minute. No Spark."""

import math
import random
import statistics

import numpy as np
import pytest

from rpcbus.analytics import series


def test_the_median_of_the_others_equals_brute_force_with_ties_and_gaps():
    rng = random.Random(7)
    for _ in range(300):
        providers, columns = rng.randint(1, 9), rng.randint(1, 5)
        values = np.array([[rng.choice([math.nan, 1.0, 2.0, rng.random() * 10])
                            for _ in range(columns)] for _ in range(providers)])
        got, peers = series.others_median(values)
        for i in range(providers):
            for j in range(columns):
                others = [values[k, j] for k in range(providers)
                          if k != i and not math.isnan(values[k, j])]
                assert peers[i, j] == len(others)
                if others:
                    assert got[i, j] == pytest.approx(statistics.median(others))
                else:
                    assert math.isnan(got[i, j])


def reference_quantile(buckets, q, lo, hi):
    """The rule of analytics/rollup.py ``quantiles`` written out per bucket."""
    total, below = sum(buckets), 0
    lows, highs = [0.0, *series.BOUNDS], [*series.BOUNDS, math.inf]
    if total == 0:
        return None
    pct = round(q * 100)
    for pos, n in enumerate(buckets):
        if (below + n) * 100 >= total * pct:
            a = lows[pos]
            b = highs[pos] if highs[pos] != math.inf else (a if hi is None else hi)
            frac = (total * pct / 100 - below) / n
            v = a * (b / a) ** frac if a > 0 and b > a else a + (b - a) * frac
            return min(max(v, lo or 0.0), math.inf if hi is None else hi)
        below += n
    raise AssertionError("unreachable")


def test_percentiles_are_the_sql_rule_bucket_for_bucket():
    rng = random.Random(3)
    rows, los, his = [], [], []
    for _ in range(400):
        hist = [0] * series.BUCKETS
        for _ in range(rng.choice([0, 1, 2, 5, 50])):
            hist[rng.randrange(series.BUCKETS)] += rng.randint(1, 9)
        rows.append(hist)
        known = rng.random() < 0.8
        los.append(0.0004 if known else None)
        his.append(75.0 if known else None)
    got = series.quantiles(np.array(rows), np.array([math.nan if x is None else x for x in los]),
                           np.array([math.nan if x is None else x for x in his]),
                           (0.5, 0.95, 0.99))
    for i, hist in enumerate(rows):
        for q in (0.5, 0.95, 0.99):
            want = reference_quantile(hist, q, los[i], his[i])
            if want is None:
                assert math.isnan(got[q][i])
            else:
                assert got[q][i] == pytest.approx(want), (hist, q)


def test_merging_adds_sums_and_keeps_the_extremes_minute_by_minute():
    def one(minutes, calls, peak, lo, start):
        n = len(minutes)
        cols = {c: np.zeros(n) for c in series.FIELDS}
        cols.update(minute=np.array(minutes, float), calls=np.array(calls, float),
                    peak_in_flight=np.array(peak, float), latency_min_s=np.array(lo, float),
                    latency_max_s=np.array(lo, float), window_start=np.array(start, float),
                    window_end=np.array(start, float) + 10)
        hist = np.zeros((n, series.BUCKETS), np.int64)
        hist[:, 2] = calls
        return series.Series("p", "rpc", "n", cols, hist)

    a = one([60, 120], [3, 4], [2, 9], [0.5, math.nan], [60, 130])
    b = one([120, 180], [5, 1], [7, 1], [0.2, 0.1], [125, 180])
    m = series.merge([a, b])
    assert m.minutes.tolist() == [60, 120, 180]
    assert m.cols["calls"].tolist() == [3, 9, 1]
    assert m.cols["peak_in_flight"].tolist() == [2, 9, 1]
    assert m.cols["latency_min_s"].tolist() == [0.5, 0.2, 0.1]      # NaN: nothing sampled
    assert m.cols["window_start"].tolist() == [60, 125, 180]
    assert m.buckets[:, 2].tolist() == [3, 9, 1]
    whole = series.merge([a, b], by_minute=False)
    assert whole.cols["calls"].tolist() == [13] and whole.cols["window_end"].tolist() == [190]
