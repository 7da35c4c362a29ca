"""A provider's figures for one rpc (broker/discovery.py): two halves, the older one
dropped; and the router keeps them per (provider, rpc), so a name nobody calls shows no
calls whatever its provider's other names carry."""

import pytest

from rpcbus.broker.discovery import HALF, MinuteStats, quantile
from rpcbus.schema import BOUNDS

from .test_router import Peer, make, requests_to


def ended(m: MinuteStats, n: int, seconds: float) -> None:
    """``n`` attempts sent and ended, each timed at ``seconds``, as the router does."""
    for _ in range(n):
        m.sent += 1
        m.sample(seconds)


def test_a_provider_minute_keeps_two_halves_and_drops_the_oldest():
    m = MinuteStats(now=0.0)
    ended(m, 10, 0.002)
    m.errors += 2
    rate, ms, outstanding, calls, errors, p50, p99 = m.figures(10.0, 0.0, held=0)
    assert (rate, outstanding, calls, errors) == (1.0, 0, 10, 2)  # 10 calls in 10 s
    assert 1.9 < ms < 2.1
    m.rotate(0)                                  # 30 s on: the first half is the older one
    ended(m, 5, 0.2)
    m.sent += 3                                  # three under way
    figures = m.figures(HALF + 10, HALF, held=3)
    assert figures[2:5] == [3, 15, 2]
    assert figures[1] == 200.0                   # up at once to a slow attempt's time
    p50, p99 = figures[5:]
    assert p50 < 3 < 150 < p99 <= 250            # ms: most were quick, the slowest 0.2 s
    m.rotate(3)                                  # the first half is dropped
    rate, ms, outstanding, calls, errors, p50, p99 = m.figures(2 * HALF + 10, 2 * HALF, held=3)
    assert (calls, errors) == (5, 0) and 150 < p50 <= p99 <= 250   # only the slow ones
    assert rate == round(5 / (HALF + 10), 1)
    m.rotate(0)                                  # the three ended: in the next half
    assert m.figures(3 * HALF, 3 * HALF, held=0)[3:5] == [3, 0]
    m.rotate(0)
    assert m.figures(4 * HALF, 4 * HALF, held=0)[3:] == [0, 0, None, None]


def test_quantiles_interpolate_within_their_bucket():
    buckets = [0] * (len(BOUNDS) + 1)
    i = BOUNDS.index(next(b for b in BOUNDS if b >= 0.01))
    buckets[i] = 4
    lo, hi = BOUNDS[i - 1], BOUNDS[i]
    assert quantile(buckets, 0.5) == pytest.approx(lo + (hi - lo) / 2)
    assert quantile([0] * (len(BOUNDS) + 1), 0.5) is None


def test_one_connection_providing_several_names_shows_each_names_own_figures():
    r, caller, prov = make(), Peer("c"), Peer("p")
    prov.provider_name = "p"
    r.provide(prov, ["shop.price", "shop.reserve", "shop.quiet"])
    for cid in range(6):                         # 6 calls of shop.price, all answered
        r.request(caller, cid, "shop.price", None, None, now=1.0)
        [req] = requests_to(prov)
        r.read_at = 1.0 + 0.004
        r.respond(prov, req[1], "ok")
    for cid in range(10, 13):                    # 3 of shop.reserve: one fails, two wait
        r.request(caller, cid, "shop.reserve", None, None, now=1.0)
    reqs = requests_to(prov)
    r.provider_error(prov, reqs[0][1], "boom")
    for req in reqs[1:]:
        r.accept(prov, req[1], 1.0)
    r.tick(2.0)
    view = r.figures.view(["shop.price", "shop.reserve", "shop.quiet"], r.now)
    price, reserve, quiet = (view[n][0] for n in ("shop.price", "shop.reserve", "shop.quiet"))
    #   [name, calls/s, ms, outstanding, calls, errors, p50, p99, label]
    assert price[3:6] == [0, 6, 0] and price[6] is not None
    assert reserve[3:6] == [2, 1, 1]
    assert quiet[1:8] == [0.0, 0.0, 0, 0, 0, None, None]   # nobody called it
    r.unprovide(prov, ["shop.reserve"])          # its two calls in flight keep their figures
    for req in reqs[1:]:
        r.respond(prov, req[1], "late")
    assert "shop.reserve" not in r.figures.view(["shop.reserve"], r.now)
    r.provide(prov, ["shop.reserve"])            # provided again: counted afresh
    assert r.figures.view(["shop.reserve"], r.now)["shop.reserve"][0][3:6] == [0, 0, 0]
