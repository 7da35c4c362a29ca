"""The driver-side arithmetic of the analysis (analytics/series.py, periods.py) against
brute force: the median of the *other* providers' values, the interpolated histogram
percentiles, the merging of series minute by minute, and the per-period tables. No
Spark."""

import math
import random
import statistics

import numpy as np
import pytest

from rpcbus.analytics import findings, periods, series


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
    """The rule of analytics/series.py ``quantiles`` written out per bucket."""
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


def test_percentiles_follow_the_rule_bucket_for_bucket():
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


def test_a_period_table_row_is_its_series_minutes_merged_and_figured():
    rng = random.Random(5)

    def one(provider, minutes):
        n = len(minutes)
        cols = {c: np.array([float(rng.randint(0, 9)) for _ in range(n)]) for c in series.FIELDS}
        lo = np.array([rng.choice([math.nan, 0.001, 0.01]) for _ in range(n)])
        cols.update(minute=np.array(minutes, float), nrows=np.full(n, 6.0), latency_min_s=lo,
                    latency_max_s=lo * 20)
        hist = np.array([[rng.choice([0, 0, 1, 3]) for _ in range(series.BUCKETS)]
                         for _ in range(n)])
        return series.Series(provider, "rpc", "n1", cols, hist)

    some = [one(f"p{i}", sorted(rng.sample(range(0, 3 * 3600, 60), 50))) for i in range(4)]
    span = (600.0, 3 * 3600 - 300.0)
    got = periods.columns(some, 3600, span)
    keys = list(zip(got["provider"], got["period_start"].tolist(), strict=True))
    assert keys == sorted({(s.provider, m // 3600 * 3600) for s in some
                           for m in s.minutes.tolist()})   # each series' hours, in order
    for i, (provider, hour) in enumerate(keys):
        s = next(s for s in some if s.provider == provider)
        keep = s.minutes // 3600 * 3600 == hour
        m = series.merge([series.Series(provider, "rpc", "n1", {c: v[keep] for c, v in
                                                                  s.cols.items()},
                                        s.buckets[keep])], by_minute=False)
        want = findings.figure_columns(m.cols, m.buckets)
        for c in (*periods.SCHEMA_COLUMNS[4:-1],):
            assert got[c][i] == pytest.approx(want[c][0], nan_ok=True), (provider, hour, c)
        assert got["calls_per_s"][i] == pytest.approx(
            m.cols["calls"][0] / (min(hour + 3600, span[1]) - max(hour, span[0])))
    minutes = periods.columns(some, 60, span)      # the rollup's minutes are the periods
    assert minutes["period_start"].tolist() == [m for s in some for m in s.minutes.tolist()]
    assert minutes["calls"].tolist() == [c for s in some for c in s.cols["calls"].tolist()]
