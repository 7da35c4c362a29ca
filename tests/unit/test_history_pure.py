"""The load history's counting with the router (pure): answers derived from attempts
started and pending, across windows."""

from rpcbus.broker.history import History

from .test_cluster_pure import View, router
from .test_router import Peer
from .test_weights_pure import Provider


class Rows:
    def __init__(self):
        self.rows = []

    def put(self, rows):
        self.rows.append(rows)


def test_history_derives_answers_from_starts_and_pending_across_windows():
    rows = Rows()
    r, caller, p = router(View()), Peer("c"), Provider("w1")
    r.cluster = None                                     # one node
    h = History("n1", 10.0, rows, now_wall=0.0, clock=lambda: 1.0)
    r.record(h)
    r.provide(p, ["x"])
    for i in range(5):
        r.request(caller, i, "x", {"i": i}, None, now=0.0)
    ids = [m[1] for m in p.take()]
    h.scan(r.history_pending())                          # the in-flight sample sees 5
    r.respond(p, ids[0], "a")
    r.respond(p, ids[1], "b")
    r.provider_error(p, ids[2], "boom")
    assert h.roll(10.0, r.history_pending()) == 1
    [w1] = rows.rows[-1]
    assert (w1["calls"], w1["ok"], w1["errors"], w1["peak_in_flight"]) == (3, 2, 1, 5)
    r.respond(p, ids[3], "c")
    r.reject(p, ids[4], now=0.0)                         # nobody else: NO_PROVIDER
    assert h.roll(20.0, r.history_pending()) == 1
    [w2] = rows.rows[-1]
    assert (w2["calls"], w2["ok"], w2["rejected"], w2["peak_in_flight"]) == (2, 1, 1, 2)
    assert h.roll(30.0, r.history_pending()) == 0      # no work: no row
    assert r.pending == 0
    # with presence: a provided rpc with no work still gets a row, so an analysis sees it
    r.provide(p, ["y"])
    r.request(caller, 9, "y", {}, None, now=0.0)
    assert h.roll(40.0, r.history_pending(), provided=r.provided_pairs) == 2
    rows_40 = {w["rpc"]: w for w in rows.rows[-1]}
    assert (rows_40["x"]["calls"], rows_40["x"]["peak_in_flight"]) == (0, 0)
    assert rows_40["x"]["provider"] == "w1" and rows_40["x"]["served_by"] == "n1"
    assert rows_40["y"]["peak_in_flight"] == 1                  # a row of work, not presence


def test_a_providers_peak_adds_its_routing_nodes_sampled_together():
    """Two routing nodes' attempts at one provider: each row keeps its own peak, and both
    carry the provider's, the most of the sums taken at the same instants (7, not 5 + 4)."""
    rows = Rows()
    h = History("n1", 10.0, rows, now_wall=0.0)
    p, q = Provider("w1"), Provider("w2")
    a, b, other = h.row_for(p, ("x", "n2")), h.row_for(p, ("x", "n3")), h.row_for(q, "x")
    for row in (a, b, other):
        row.started = 1
    h.scan({a: 3, b: 4, other: 9})
    h.scan({a: 5, b: 0})
    h.roll(10.0, {b: 1})                  # one still pending at b when the window closes
    got = {r["routed_by"] if r["provider"] == "w1" else "q": r for r in rows.rows[-1]}
    assert {k: (r["peak_in_flight"], r["provider_peak_in_flight"]) for k, r in got.items()} \
        == {"n2": (5, 7), "n3": (4, 7), "q": (9, 9)}
    h.scan({b: 2})                        # the next window starts from what was pending
    h.roll(20.0, {})
    assert [(r["peak_in_flight"], r["provider_peak_in_flight"]) for r in rows.rows[-1]] \
        == [(2, 2)]
