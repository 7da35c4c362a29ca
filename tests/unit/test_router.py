"""The routing state machine, driven with fake peers and a fake clock."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus import errors
from rpcbus.broker.router import Router
from rpcbus.protocol import CANCEL, ERROR, REQUEST, RESPONSE


class Peer:
    def __init__(self, label):
        self.label = label
        self.user_name = None
        self.closed = False
        self.inflight = 0
        self.calls = {}
        self.accepted_upto = 0
        self.runs_before_accept = False
        self.load = 0
        self.attempts = 0
        self.rate = 0.0
        self.lat = self.seen = self.steady = 0.0
        self.minutes = None
        self.pace = None
        self.provides = set()
        self.is_node = False
        self.sent = []

    def send(self, msg):
        assert not self.closed, "the router sent to a closed peer"
        self.sent.append(msg)

    def take(self):
        out, self.sent = self.sent, []
        return out

    def __repr__(self):
        return self.label


def make(**kw):
    # no provider fills here unless a test says so (admission: tests/unit/test_admission.py)
    opts = dict(ack_timeout=1.0, response_timeout=10.0, max_timeout=60.0, now=0.0,
                initial_concurrency=1e9)
    opts.update(kw)
    return Router(**opts)


def requests_to(peer):
    return [m for m in peer.take() if m[0] == REQUEST]


def assert_empty(router, *callers):
    """No call pending, no caller counted in flight, and the deadlines left send nothing."""
    assert router.pending == 0
    for c in callers:
        assert c.inflight == 0 and not c.calls
    peers = {id(c): c for c in callers}
    before = {k: len(c.sent) for k, c in peers.items()}
    router.tick(10_000.0)
    assert router.timers == 0
    assert {k: len(c.sent) for k, c in peers.items()} == before


def test_call_reaches_the_provider_and_the_answer_reaches_the_caller():
    r, caller, prov = make(), Peer("c"), Peer("p")
    r.provide(prov, ["math.add"])
    r.request(caller, 7, "math.add", {"a": 1}, None, now=0.0)
    [req] = requests_to(prov)
    assert req[:4] == [REQUEST, req[1], "math.add", {"a": 1}]
    assert req[4] == 10_000 and req[5] == "c"       # time left in ms, the caller's label
    r.respond(prov, req[1], 3)
    assert caller.take() == [[RESPONSE, 7, 3]]
    assert_empty(r, caller)


def test_only_the_chosen_provider_can_answer_or_accept():
    r, caller, p1, p2 = make(), Peer("c"), Peer("p1"), Peer("p2")
    r.provide(p1, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = requests_to(p1)
    r.respond(p2, req[1], "forged")
    r.accept(p2, req[1], 0.0)
    r.reject(p2, req[1], 0.0)
    assert caller.take() == [] and r.stats.foreign == 3
    r.respond(p1, req[1], "real")
    assert caller.take() == [[RESPONSE, 1, "real"]]


def test_reject_moves_the_call_to_a_provider_not_yet_tried_then_no_provider():
    r, caller = make(), Peer("c")
    provs = [Peer(f"p{i}") for i in range(3)]
    for p in provs:
        r.provide(p, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    seen = []
    for _ in range(3):
        [(p, req)] = [(p, m) for p in provs for m in requests_to(p)]
        assert p not in seen
        seen.append(p)
        r.reject(p, req[1], now=0.0)
    [err] = caller.take()
    assert err[:3] == [ERROR, 1, errors.NO_PROVIDER]
    assert_empty(r, caller)


def test_ack_timeout_moves_the_call_cancels_the_silent_provider_and_drops_its_late_answer():
    r, caller, slow, fast = make(rand=lambda: 0.0), Peer("c"), Peer("slow"), Peer("fast")
    r.provide(slow, ["x"])
    r.provide(fast, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = requests_to(slow)                       # rand 0.0 picks the first
    r.tick(0.99)
    assert requests_to(fast) == []                  # not yet
    r.tick(1.02)
    assert slow.take() == [[CANCEL, req[1]]]
    [req2] = requests_to(fast)
    assert req2[1] != req[1] and req2[4] < 10_000
    r.respond(slow, req[1], "late")                 # dropped, counted
    assert r.stats.late == 1 and caller.take() == []
    r.respond(fast, req2[1], "ok")
    assert caller.take() == [[RESPONSE, 1, "ok"]]
    assert r.stats.ack_timeouts == 1
    assert_empty(r, caller)


def test_accepted_call_waits_for_the_response_deadline_and_is_never_retried():
    r, caller, p1, p2 = make(), Peer("c"), Peer("p1"), Peer("p2")
    r.provide(p1, ["x"])
    r.provide(p2, ["x"])
    r.request(caller, 1, "x", None, 2000, now=0.0)
    [(p, req)] = [(p, m) for p in (p1, p2) for m in requests_to(p)]
    r.accept(p, req[1], now=0.1)
    r.tick(1.9)
    assert caller.take() == []
    r.tick(2.02)
    [err] = caller.take()
    assert err[:3] == [ERROR, 1, errors.RESPONSE_TIMEOUT]
    assert p.take() == [[CANCEL, req[1]]]
    other = p2 if p is p1 else p1
    assert requests_to(other) == []
    assert_empty(r, caller)


def test_accept_upto_accepts_every_attempt_up_to_its_id_that_was_not_rejected():
    r, caller, p1, p2 = make(rand=lambda: 0.0), Peer("c"), Peer("p1"), Peer("p2")
    r.provide(p1, ["x"])
    r.provide(p2, ["x"])
    for cid in (1, 2, 3):
        r.request(caller, cid, "x", cid, 5000, now=0.0)
    a, b, c = requests_to(p1)
    r.reject(p1, b[1], now=0.0)                 # refused (stale): it moves to p2
    [b2] = requests_to(p2)
    p1.accepted_upto = b[1]                     # [ACCEPT_UPTO, b's id], after that REJECT
    p2.accepted_upto = b2[1]
    r.tick(1.1)                                 # the ack timeout (1 s) of a, c and b2
    assert p1.take() == [[CANCEL, c[1]]]        # a is accepted; c was not: moved
    [c2] = requests_to(p2)
    assert c2[3] == 3 and caller.take() == []   # b2 is accepted at p2
    r.drop_peer(p1, now=1.2)                    # a may have run: not moved
    assert [m[:3] for m in caller.take()] == [[ERROR, 1, errors.PROVIDER_GONE]]
    r.respond(p2, b2[1], "b")
    r.respond(p2, c2[1], "c")
    assert caller.take() == [[RESPONSE, 2, "b"], [RESPONSE, 3, "c"]]
    assert_empty(r, caller)


def test_callers_timeout_is_capped_and_no_attempt_starts_after_the_deadline():
    r, caller, p1, p2 = make(ack_timeout=1.0), Peer("c"), Peer("p1"), Peer("p2")
    r.provide(p1, ["x"])
    r.request(caller, 1, "x", None, 10**9, now=0.0)
    [req] = requests_to(p1)
    assert req[4] == 60_000                          # max_timeout
    r.respond(p1, req[1], None)
    caller.take()
    r.provide(p2, ["x"])
    r.request(caller, 2, "x", None, 500, now=0.0)   # deadline (0.5 s) before the ack timeout
    [(p, req)] = [(p, m) for p in (p1, p2) for m in requests_to(p)]
    r.tick(0.52)
    [err] = caller.take()
    assert err[:3] == [ERROR, 2, errors.RESPONSE_TIMEOUT]
    assert requests_to(p1) == requests_to(p2) == []  # nothing started after the deadline
    assert_empty(r, caller)


def test_provider_gone_before_accept_retries_after_accept_fails_at_once():
    r, caller, p1, p2 = make(rand=lambda: 0.0), Peer("c"), Peer("p1"), Peer("p2")
    r.provide(p1, ["x"])
    r.provide(p2, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    r.request(caller, 2, "x", None, None, now=0.0)
    a, b = requests_to(p1)
    r.accept(p1, b[1], now=0.0)
    p1.closed = True
    r.drop_peer(p1, now=0.1)
    [err] = caller.take()
    assert err[:3] == [ERROR, 2, errors.PROVIDER_GONE]
    [moved] = requests_to(p2)
    assert moved[2] == "x"
    r.respond(p2, moved[1], "fine")
    assert caller.take() == [[RESPONSE, 1, "fine"]]
    assert r.providers_of("x") == [p2]
    assert_empty(r, caller)


def test_a_caller_that_leaves_cancels_its_calls_at_their_providers():
    r, caller, other, prov = make(), Peer("c"), Peer("o"), Peer("p")
    r.provide(prov, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    r.request(caller, 2, "x", None, None, now=0.0)
    r.request(other, 1, "x", None, None, now=0.0)  # the same id, another caller: kept
    first, second, others = requests_to(prov)
    caller.closed = True
    r.drop_peer(caller, now=0.0)
    assert prov.take() == [[CANCEL, first[1]], [CANCEL, second[1]]]
    assert r.stats.cancelled == 2 and r.pending == 1
    r.respond(prov, first[1], "nobody listens")  # too late: dropped, counted
    assert r.stats.late == 1 and r.stats.discarded == 0
    r.respond(prov, others[1], "yours")
    assert other.take() == [[RESPONSE, 1, "yours"]]
    assert_empty(r, caller)
    assert_empty(r, other)


def test_cancel_costs_one_lookup_and_ids_in_flight_are_unique_per_caller():
    r, caller, prov = make(), Peer("c"), Peer("p")
    r.provide(prov, ["x"])
    for cid in range(1, 2001):
        r.request(caller, cid, "x", None, None, now=0.0)
    requests_to(prov)
    r.request(caller, 7, "x", None, None, now=0.0)  # 7 is in flight: refused, not routed
    assert caller.take() == [[ERROR, 7, errors.INVALID_MESSAGE,
                              "call id 7 belongs to a call still in flight"]]
    assert prov.take() == [] and r.stats.duplicate_ids == 1
    # made-up ids cost nothing and touch nothing; a real one cancels that call alone
    scans = []
    r._calls = _Counting(r._calls, scans)
    for cid in range(5000, 15000):
        r.cancel_from(caller, cid)
    r.cancel_from(caller, 7)
    assert scans == [] and r.pending == 1999 and r.stats.cancelled == 1
    assert len(prov.take()) == 1


class _Counting(dict):
    """A call table that records every walk over it (a CANCEL must never walk it)."""

    def __init__(self, table, walks):
        super().__init__(table)
        self._walks = walks

    def values(self):
        self._walks.append("values")
        return super().values()

    def __iter__(self):
        self._walks.append("iter")
        return super().__iter__()


def test_unknown_and_invalid_names():
    r, caller = make(), Peer("c")
    r.request(caller, 1, "nobody", None, None, now=0.0)
    r.request(caller, 2, "bad name!", None, None, now=0.0)
    (e1, e2) = caller.take()
    assert e1[:3] == [ERROR, 1, errors.NO_PROVIDER]
    assert e2[:3] == [ERROR, 2, errors.INVALID_MESSAGE]
    assert_empty(r, caller)


def test_provider_error_passes_the_message_not_more():
    r, caller, prov = make(), Peer("c"), Peer("p")
    r.provide(prov, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = requests_to(prov)
    r.provider_error(prov, req[1], "boom" * 5000)
    [err] = caller.take()
    assert err[:3] == [ERROR, 1, errors.PROVIDER_ERROR] and len(err[3]) == 4096


def test_choice_is_uniform_over_providers():
    r, caller = make(), Peer("c")
    provs = [Peer(f"p{i}") for i in range(4)]
    for p in provs:
        r.provide(p, ["x"])
    for i in range(8000):
        r.request(caller, i, "x", None, None, now=0.0)
    counts = [len(requests_to(p)) for p in provs]
    # Each count is Binomial(8000, 1/4): sd ~ 38.7; 7 sd bounds fail with p < 1e-11.
    assert all(abs(c - 2000) < 7 * 38.7 for c in counts), counts


def test_unprovide_stops_new_calls_but_lets_calls_in_flight_finish():
    r, caller, prov = make(), Peer("c"), Peer("p")
    r.provide(prov, ["x", "y"])
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = requests_to(prov)
    r.unprovide(prov, ["x"])
    assert prov.provides == {"y"}
    r.request(caller, 2, "x", None, None, now=0.0)
    assert caller.take()[0][:3] == [ERROR, 2, errors.NO_PROVIDER]
    r.respond(prov, req[1], "done")
    assert caller.take() == [[RESPONSE, 1, "done"]]


# -- every call ends exactly once, whatever happens ------------------------------------

events = st.lists(st.tuples(
    st.sampled_from(["call", "accept", "respond", "reject", "error", "tick", "drop", "provide"]),
    st.integers(0, 3), st.integers(0, 50)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from([1e9, 1.0]))
def test_every_call_gets_exactly_one_outcome_and_tables_empty_afterwards(script, room):
    """Also with providers that hold one attempt at a time (calls wait for slots, are
    refused BUSY or LATE, and shed): still one outcome each, every table empty after."""
    r = make(ack_timeout=0.5, response_timeout=3.0, initial_concurrency=room,
             ack_timeout_max=2.0, queue_target=0.2, queue_interval=0.5)
    callers = [Peer(f"c{i}") for i in range(2)]
    provs = [Peer(f"p{i}") for i in range(4)]
    for p in provs[:2]:
        r.provide(p, ["x"])
    now, cid, made = 0.0, 0, []
    outcomes = Counter()

    def drain():
        for c in callers:
            for m in c.take():
                assert m[0] in (RESPONSE, ERROR)
                outcomes[m[1]] += 1

    for kind, who, n in script:
        live = [p for p in provs if not p.closed]
        if kind == "call":
            cid += 1
            made.append(cid)
            r.request(callers[who % 2], cid, "x", None, None if n % 2 else 1000 + n * 10, now)
        elif kind == "tick":
            now += n / 20
            r.tick(now)
        elif kind == "drop" and live:
            p = live[who % len(live)]
            p.closed = True
            r.drop_peer(p, now)
        elif kind == "provide" and live:
            r.provide(live[who % len(live)], ["x"])
        elif live:
            p = live[who % len(live)]
            reqs = [m for m in p.sent if m[0] == REQUEST]
            if reqs:
                attempt = reqs[n % len(reqs)][1]
                if kind == "accept":
                    r.accept(p, attempt, now)
                elif kind == "respond":
                    r.respond(p, attempt, "ok")
                elif kind == "reject":
                    r.reject(p, attempt, now, ("", "BUSY", "LATE")[n % 3])
                else:
                    r.provider_error(p, attempt, "boom")
        drain()
    r.tick(now + 100)
    drain()
    assert sorted(outcomes) == made
    assert all(v == 1 for v in outcomes.values())
    assert_empty(r, *callers)


def test_the_busiest_rpcs_with_cumulative_counts_and_every_calls_latency():
    """What a heartbeat carries for the dashboard: exact counts, every call's latency."""
    clock = [0.0]
    r, caller, prov = make(clock=lambda: clock[0]), Peer("c"), Peer("p")
    r.provide(prov, ["a", "b", "c"])
    for name, n, fail in (("a", 200, False), ("b", 24, True), ("c", 3, False)):
        for i in range(n):
            r.read_at = clock[0]                       # as the shell sets it per frame
            r.request(caller, i, name, None, None, now=0.0)
            [req] = requests_to(prov)
            clock[0] += 0.003                          # 3 ms each: the 5 ms bucket
            r.read_at = clock[0]
            if fail:
                r.provider_error(prov, req[1], "no")
            else:
                r.respond(prov, req[1], i)
    busiest = r.rpc_stats.busiest(2)
    assert list(busiest) == ["a", "b"]
    (a_ok, a_failed, *a_buckets), (b_ok, b_failed, *b_buckets) = busiest.values()
    assert (a_ok, a_failed, b_ok, b_failed) == (200, 0, 0, 24)
    assert a_buckets[5] == sum(a_buckets) == 200
    assert b_buckets[5] == sum(b_buckets) == 24
    histograms = r.rpc_stats.by_name["b"].histograms()
    assert list(histograms) == ["PROVIDER_ERROR"] and histograms["PROVIDER_ERROR"][0][5] == 24
    assert_empty(r, caller)


def test_a_provider_that_runs_before_it_accepts_never_has_its_call_moved():
    """A deepstream client runs a call before its ACCEPT: silent past the ack timeout, the
    call ends ACCEPT_TIMEOUT (it may have run) instead of going to the other provider;
    gone before accepting, PROVIDER_GONE. An ACCEPT in time keeps the call, as for any."""
    r, caller, ds, other = make(rand=lambda: 0.0), Peer("c"), Peer("ds"), Peer("other")
    ds.runs_before_accept = True
    r.provide(ds, ["x"])
    r.provide(other, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = requests_to(ds)
    r.tick(1.02)
    assert ds.take() == [[CANCEL, req[1]]] and requests_to(other) == []
    [err] = caller.take()
    assert err[:3] == [ERROR, 1, errors.ACCEPT_TIMEOUT] and "may have run" in err[3]
    assert r.stats.accept_timeouts == 1 and r.stats.failed() == 1

    r.request(caller, 2, "x", None, None, now=2.0)
    [req] = requests_to(ds)
    r.accept(ds, req[1], 2.1)
    r.tick(3.5)                                     # accepted: only the deadline applies
    assert caller.take() == [] and requests_to(other) == []
    r.respond(ds, req[1], "ok")
    assert caller.take() == [[RESPONSE, 2, "ok"]]

    r.request(caller, 3, "x", None, None, now=4.0)
    [req] = requests_to(ds)
    ds.closed = True
    r.drop_peer(ds, 4.1)                            # not accepted, but it may have run
    [err] = caller.take()
    assert err[:3] == [ERROR, 3, errors.PROVIDER_GONE] and requests_to(other) == []
    assert_empty(r, caller)
