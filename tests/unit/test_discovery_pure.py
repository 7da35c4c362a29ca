"""A provider's last minute (broker/discovery.py): two halves, the older one dropped."""

import pytest

from rpcbus.broker.discovery import MinuteStats, quantile
from rpcbus.schema import BOUNDS


def test_a_provider_minute_keeps_two_halves_and_drops_the_oldest():
    m = MinuteStats()
    for _ in range(10):
        m.sample(0.002)
    m.errors += 2
    assert m.figures(10)[:2] == [10, 2]          # 10 calls ended so far, 2 errors
    m.rotate(10)                                # 30 s on: the first half is the older one
    for _ in range(5):
        m.sample(0.2)
    assert m.figures(15)[:2] == [15, 2]
    calls, errors, p50, p99 = m.figures(15)
    assert p50 < 3 < 150 < p99 <= 250            # ms: most were quick, the slowest 0.2 s
    m.rotate(15)                                # the first half is dropped
    calls, errors, p50, p99 = m.figures(15)
    assert (calls, errors) == (5, 0) and 150 < p50 <= p99 <= 250   # only the slow ones
    assert m.figures(None)[0] is None           # not counted (policy cluster)
    m.rotate(15)
    assert m.figures(15) == [0, 0, None, None]


def test_quantiles_interpolate_within_their_bucket():
    buckets = [0] * (len(BOUNDS) + 1)
    i = BOUNDS.index(next(b for b in BOUNDS if b >= 0.01))
    buckets[i] = 4
    lo, hi = BOUNDS[i - 1], BOUNDS[i]
    assert quantile(buckets, 0.5) == pytest.approx(lo + (hi - lo) / 2)
    assert quantile([0] * (len(BOUNDS) + 1), 0.5) is None
