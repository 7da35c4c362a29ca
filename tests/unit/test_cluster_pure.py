"""The cluster's pure parts: batch codec, membership, provider cache, and the router with
other nodes as peers — driven with fake peers, a fake cluster view and a fake clock."""

import math

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus import errors
from rpcbus.broker.router import Router
from rpcbus.cluster import messages as m
from rpcbus.cluster.membership import Membership
from rpcbus.cluster.providers import HandoverWait, ProviderCache
from rpcbus.protocol import ACCEPT, ACK_CHECK, CANCEL, ERROR, REQUEST, RESPONSE, STREAM

from .test_router import Peer, requests_to


class Node(Peer):
    def __init__(self, label):
        super().__init__(label)
        self.is_node = True


class View:
    """A ClusterView whose answers the test sets."""

    def __init__(self, targets=None):
        self.available = True
        self.entries = targets or {}
        self.asked = []
        self.silenced = []
        self.hearing = True
        self.probes = 0

    def probe(self):
        self.probes += 1

    def targets(self, name, now, discover):
        if not self.available:
            return []
        if name in self.entries:
            return self.entries[name]
        if discover:
            self.asked.append(name)
            return None
        return []

    def silent(self, name, node):
        self.silenced.append((name, node))

    def knows(self, name):
        return name in self.entries

    def provided(self, name):
        return bool(self.entries.get(name))

    def settled(self, node, since):
        return self.hearing


def router(view, **kw):
    kw.setdefault("initial_concurrency", 1e9)  # no target fills: the choice alone
    kw.setdefault("max_concurrency", 10**9)
    return Router(ack_timeout=1.0, response_timeout=10.0, max_timeout=60.0, now=0.0,
                  cluster=view, **kw)


# -- codec ---------------------------------------------------------------------------------

@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_payloads_are_bad_batches_or_well_formed(raw):
    try:
        batch = m.decode_batch(raw)
    except m.BadBatch:
        return
    assert isinstance(batch.sender, str) and all(type(x) is list for x in batch.messages)


def test_malformed_messages_are_left_out_of_a_good_batch():
    good = [m.INVOKE, 1, "a", None, 100, 50, "c"]
    payload = msgpack.packb(["n1", 7, 0, 1.5, [good, [m.INVOKE, "x"], [99], "junk", [m.ACK, -1],
                                               [m.ECHO, 1], [m.ACK], [m.ACK, 4, "5"],
                                               [m.ACK, 4, -5]]])
    assert m.decode_batch(payload) == ("n1", 7, 0, 1.5, [good], 8)
    # one ACK names every INVOKE of a batch
    assert (m.decode_batch(m.encode_batch("n2", 8, 9, 2.0, [[m.ACK, 3, 4, 5], [m.ECHO]]))
            == ("n2", 8, 9, 2.0, [[m.ACK, 3, 4, 5], [m.ECHO]], 0))


# -- membership ----------------------------------------------------------------------------

def test_a_silent_node_dies_after_the_missed_heartbeats_and_a_stalled_self_gives_grace():
    ms = Membership("me", interval=1.0, misses=3)
    assert ms.on_state("a", m.READY, "ws://a", 100.0, {}, sent_at=5.0, now=10.0)
    ms.on_state("b", m.STARTING, "ws://b", 100.0, {}, sent_at=5.0, now=10.0)
    assert ms.answering() == ["a", "b"]    # one still starting answers queries too
    assert ms.expire(12.9) == []
    ms.grace(20.0)                       # this node was stopped: nobody is judged on that
    assert ms.expire(22.9) == [] and sorted(ms.expire(23.1)) == ["a", "b"]
    assert ms.answering() == []


def test_message_age_ignores_clock_offsets_and_resets_when_a_node_restarts():
    ms = Membership("me", interval=1.0, misses=3)
    ms.on_state("a", m.READY, "u", 100.0, {}, sent_at=1000.0, now=5.0)   # clocks far apart
    assert ms.age("a", 1001.0, 6.0) == 0.0
    assert math.isclose(ms.age("a", 1002.0, 9.5), 2.5)                  # waited 2.5 s
    ms.on_state("a", m.READY, "u", 200.0, {}, sent_at=50.0, now=10.0)   # restarted: new clock
    assert ms.age("a", 51.0, 11.0) == 0.0
    ms.on_state("a", m.TERMINATING, "u", 200.0, {}, sent_at=52.0, now=12.0)
    assert ms.answering() == []              # no new calls for it ...
    assert ms.expire(14.0) == [] and ms.expire(15.1) == ["a"]   # ... and silence still kills


# -- provider cache ------------------------------------------------------------------------

def test_a_query_completes_when_every_live_node_answered_zeros_included():
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25)
    assert cache.begin_query("x", ["a", "b"], now=0.0) == (True, False)
    assert cache.begin_query("x", ["a", "b"], now=0.0) == (False, False)   # shared
    assert not cache.on_update("a", "x", 2, now=0.01)
    assert cache.on_update("b", "x", 0, now=0.02)
    assert cache.entries["x"].targets == [("a", 2)]
    cache.on_update("b", "x", 1, now=1.0)               # later updates keep it current
    assert sorted(cache.entries["x"].targets) == [("a", 2), ("b", 1)]
    assert cache.expire(59.9) == ([], []) and "x" in cache.entries
    cache.expire(60.1)
    assert "x" not in cache.entries                      # the TTL still applies


def test_a_query_times_out_from_when_redis_took_it_not_from_the_miss():
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25)
    cache.begin_query("x", ["a"], now=0.0)
    assert cache.expire(0.3) == ([], [])                 # held up on the way to Redis
    cache.published("x", now=0.4)
    assert cache.expire(0.6) == ([], [])
    assert cache.on_update("a", "x", 1, now=0.62)        # answered within its own 0.25 s
    assert cache.entries["x"].targets == [("a", 1)]


def test_an_unanswered_query_is_unknown_not_nobody():
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25)
    waiting = {"y"}
    cache.begin_query("y", ["a", "b"], now=0.0)
    cache.published("y", now=0.0)
    cache.on_update("a", "y", 0, now=0.1)
    assert cache.expire(0.3, waiting.__contains__) == ([], ["y"])   # b silent: ask again
    assert "y" not in cache.entries                      # and no negative entry meanwhile
    cache.published("y", now=0.3)
    assert cache.on_update("b", "y", 2, now=0.4)         # b answers the second query
    assert cache.entries["y"].targets == [("b", 2)]
    # Nobody waits any more: the query ends without an entry.
    cache.begin_query("z", ["a", "b"], now=1.0)
    cache.published("z", now=1.0)
    assert cache.expire(1.3, waiting.__contains__) == (["z"], [])
    assert "z" not in cache.entries
    # A provider among the answers: used, but kept only for the short TTL.
    cache.begin_query("w", ["a", "b"], now=2.0)
    cache.published("w", now=2.0)
    cache.on_update("a", "w", 3, now=2.01)
    assert cache.expire(2.3, waiting.__contains__) == (["w"], [])
    assert cache.entries["w"].targets == [("a", 3)]
    cache.expire(3.31)
    assert "w" not in cache.entries


def test_negative_entries_and_gone_nodes():
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25)
    cache.begin_query("y", ["a", "b"], now=0.0)
    cache.on_update("a", "y", 0, now=0.1)
    assert cache.on_update("b", "y", 0, now=0.2)         # everyone said 0: nobody
    assert cache.entries["y"].targets == []              # a negative entry ...
    cache.expire(1.4)
    assert "y" not in cache.entries                      # ... that lives only briefly
    assert cache.begin_query("z", [], now=2.0) == (False, True)   # alone: known at once
    cache.begin_query("w", ["a", "b"], now=3.0)
    cache.on_update("a", "w", 3, now=3.01)
    assert cache.node_gone("b", now=3.02) == ["w"]       # b's death completes the query
    cache.forget_node_for("w", "a")                      # a, its only provider, was silent:
    assert "w" not in cache.entries                      # not "nobody", unknown: asked afresh
    cache.begin_query("v", ["a", "b"], now=5.0)
    cache.on_update("a", "v", 1, now=5.01)
    cache.on_update("b", "v", 2, now=5.02)
    cache.forget_node_for("v", "a")                      # one of two was silent
    assert cache.entries["v"].targets == [("b", 2)]
    cache.expire(6.1)
    assert "v" not in cache.entries                      # asked afresh soon


def test_a_node_that_just_joined_waits_for_a_round_of_heartbeats_before_trusting_answers():
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25)
    assert cache.begin_query("x", [], now=0.0, settled_at=1.5) == (True, False)
    cache.published("x", now=0.0)
    assert not cache.on_update("late-known", "x", 2, now=0.5)   # a peer it had not heard yet
    assert cache.expire(1.4) == ([], [])
    assert cache.expire(1.5) == (["x"], []) and cache.entries["x"].targets == [("late-known", 2)]


# -- the router with other nodes ----------------------------------------------------------

def test_weighted_choice_counts_local_providers_and_node_counts():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 3), (b, 1)]})
    r, caller, local = router(view), Peer("c"), Peer("p")
    r.provide(local, ["x"])
    picks = {"A": 0, "B": 0, "p": 0}
    for i in range(10_000):
        r.request(caller, i, "x", None, None, now=0.0)
    for peer in (a, b, local):
        picks[peer.label] = sum(1 for msg in peer.take() if msg[0] == REQUEST)
    # Expected 3/5, 1/5, 1/5 of 10,000: sd <= 49; 6 sd bounds.
    assert abs(picks["A"] - 6000) < 300 and abs(picks["B"] - 2000) < 240
    assert abs(picks["p"] - 2000) < 240


def test_calls_wait_for_discovery_with_their_deadline():
    view = View()
    r, caller, b = router(view), Peer("c"), Node("B")
    r.request(caller, 1, "x", "d1", None, now=0.0)
    r.request(caller, 2, "x", "d2", 500, now=0.0)
    assert view.asked == ["x", "x"] and caller.take() == [] and b.take() == []
    r.tick(0.52)                                         # call 2's deadline passes while parked
    [err] = caller.take()
    # it never left (not run), and nobody said who provides "x": not "nobody does"
    assert err[:3] == [ERROR, 2, errors.CLUSTER_UNAVAILABLE]
    view.entries["x"] = [(b, 1)]
    r.resume("x", now=0.6)
    [req] = b.take()
    assert req[0] == REQUEST and req[3] == "d1"
    r.respond(b, req[1], "ok")
    assert caller.take() == [[RESPONSE, 1, "ok"]]


def test_a_stopping_node_hands_back_only_the_calls_no_provider_holds():
    view = View({"held": [(Node("B"), 1)]})
    r, caller = router(view), Peer("c")
    r.request(caller, 1, "waiting", None, None, now=0.0)     # parked: discovery pending
    r.request(caller, 2, "held", None, None, now=0.0)        # sent to node B
    assert r.hand_back() == 1
    assert caller.take() == [[ERROR, 1, errors.SHUTTING_DOWN,
                              "the node is shutting down: not run, call again on another node"]]
    assert r.pending == 1 and caller.inflight == 1
    r.resume("waiting", now=0.1)                             # discovery ends: nothing left
    r.tick(0.5)
    assert caller.take() == [] and r.pending == 1


def test_a_node_acknowledges_then_may_reject_and_a_silent_node_is_reported():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1), (b, 1)]})
    r, caller = router(view, rand=lambda: 0.0), Peer("c")
    r.request(caller, 1, "x", None, None, now=0.0)
    [req] = a.take()
    r.ack(a, req[1])
    r.tick(2.0)                                          # acked: no ack timeout any more
    assert b.take() == []
    r.reject(a, req[1], now=2.0)                         # A's providers all declined
    [req_b] = b.take()
    r.tick(3.1)                                          # no ACK from B: ask it first
    assert b.take() == [[ACK_CHECK, req_b[1]]] and caller.take() == []
    r.tick(4.2)                                          # B stays silent: given up
    assert b.take() == [[CANCEL, req_b[1]]] and view.silenced == [("x", b)]
    [err] = caller.take()  # B provides "x" but was too slow: not "nobody provides it"
    assert err[:3] == [ERROR, 1, errors.CLUSTER_UNAVAILABLE]


def test_a_late_ack_keeps_the_call_on_its_node_and_a_refused_check_moves_it():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1), (b, 1)]})
    r, caller = router(view, rand=lambda: 0.0), Peer("c")
    r.request(caller, 1, "x", "d1", None, now=0.0)
    r.request(caller, 2, "x", "d2", None, now=0.0)
    first, second = a.take()
    r.tick(1.05)                                         # both ack deadlines pass
    assert a.take() == [[ACK_CHECK, first[1]], [ACK_CHECK, second[1]]]
    r.ack(a, first[1])                                   # A had started call 1
    r.reject(a, second[1], now=1.1)                      # A never started call 2
    [moved] = b.take()
    assert moved[3] == "d2"
    r.tick(5.0)
    assert a.take() == [] and caller.take() == []        # call 1 still waits for A
    r.respond(a, first[1], "ran once")
    r.respond(b, moved[1], "ran once too")
    assert caller.take() == [[RESPONSE, 1, "ran once"], [RESPONSE, 2, "ran once too"]]


def test_a_node_that_does_not_hear_itself_fails_a_silent_attempt_instead_of_moving_it():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1), (b, 1)]})
    r, caller = router(view, rand=lambda: 0.0), Peer("c")
    r.request(caller, 1, "x", "d1", None, now=0.0)
    [req] = a.take()
    r.tick(1.05)
    assert a.take() == [[ACK_CHECK, req[1]]]
    view.hearing = False              # A's ACK may have come and been lost on the way here
    r.tick(2.1)
    assert a.take() == [[CANCEL, req[1]]] and b.take() == [] and view.silenced == []
    [err] = caller.take()
    assert err[:3] == [ERROR, 1, errors.CLUSTER_UNAVAILABLE]
    assert r.pending == 0 and r.stats.cluster_unavailable == 1


def test_a_peer_whose_answers_cannot_be_read_fails_its_attempts_but_stays():
    a = Node("A")
    view = View({"x": [(a, 1)]})
    r, caller = router(view), Peer("c")
    r.request(caller, 1, "x", None, None, now=0.0)
    r.request(caller, 2, "x", None, None, now=0.0)
    first, second = a.take()
    r.ack(a, first[1])
    r.fail_peer(a, errors.CLUSTER_UNAVAILABLE, "clock off")
    assert [e[:3] for e in caller.take()] == [[ERROR, 1, errors.CLUSTER_UNAVAILABLE],
                                               [ERROR, 2, errors.CLUSTER_UNAVAILABLE]]
    assert a.take() == [[CANCEL, first[1]], [CANCEL, second[1]]] and r.pending == 0
    r.request(caller, 3, "x", None, None, now=0.5)     # still a target afterwards
    assert len(a.take()) == 1


def test_calls_at_nodes_wait_through_a_bus_reset_and_are_asked_about_after_it():
    """A bus reset fails nothing that could wait: each call at another node waits (it
    may be running there) and is asked about once the bus is back; ACK keeps it waiting
    for its answer, REJECT (never started) moves it, DONE (ran, answer lost) and silence
    end it CLUSTER_UNAVAILABLE. A stream there fails at once: its parts may be lost."""
    a = Node("A")
    view = View({"x": [(a, 1)]})
    r, caller, local = router(view, rand=lambda: 0.99), Peer("c"), Peer("p")
    r.provide(local, ["x"])
    for cid in (1, 2, 3, 4):                             # rand .99 -> A (weights 1 + 1)
        r.request(caller, cid, "x", None, None, now=0.0)
    r.request(caller, 5, "x", None, None, now=0.0, window=4)
    sent = a.take()
    assert [msg[0] for msg in sent] == [REQUEST] * 4 + [STREAM]
    ids = [msg[1] for msg in sent]
    r.ack(a, ids[0], ids[1])                             # 1, 2 started there; 3, 4 not yet
    view.available = False
    r.cluster_down(now=0.1)
    assert [m[:3] for m in caller.take()] == [[ERROR, 5, errors.CLUSTER_UNAVAILABLE]]
    r.tick(now=5.0)                                      # ack deadlines pass: nothing moves
    assert caller.take() == [] and local.take() == [] and a.take() == []
    r.request(caller, 6, "x", None, None, now=5.0)       # new calls: local providers only
    [req] = [m for m in local.take() if m[0] == REQUEST]
    r.respond(local, req[1], "local")
    assert caller.take() == [[RESPONSE, 6, "local"]]
    view.available = True
    r.cluster_up(now=6.0)
    assert a.take() == [[ACK_CHECK, ids[0], -1], [ACK_CHECK, ids[1], -1],
                        [ACK_CHECK, ids[2], 6000], [ACK_CHECK, ids[3], 6000]]
    r.respond(a, ids[0], "ran")                          # still running there: answered
    r.lost(a, ids[1])                                    # ran, its answer lost on the bus
    r.reject(a, ids[2], now=6.1)                         # never started: moves (here)
    [moved] = [m for m in local.take() if m[0] == REQUEST]
    r.respond(local, moved[1], "moved")
    out = caller.take()
    assert out[:2] == [[RESPONSE, 1, "ran"], [ERROR, 2, errors.CLUSTER_UNAVAILABLE,
                                              out[1][3]]] and "lost" in out[1][3]
    assert out[2:] == [[RESPONSE, 3, "moved"]]
    r.tick(now=7.1)                                      # 4: not answered in an ack timeout
    [err] = caller.take()
    assert err[:3] == [ERROR, 4, errors.CLUSTER_UNAVAILABLE] and "did not say" in err[3]
    assert r.stats.bus_waits == 4 and r.stats.answers_lost == 1
    assert r.pending == 0


def test_a_dead_node_fails_the_attempts_it_acknowledged_and_the_others_move():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1), (b, 1)]})
    r, caller = router(view, rand=lambda: 0.0), Peer("c")
    r.request(caller, 1, "x", "d1", None, now=0.0)
    r.request(caller, 2, "x", "d2", None, now=0.0)
    first, _ = a.take()
    r.ack(a, first[1])                                   # A started call 1
    a.closed = True
    r.drop_peer(a, now=0.5)
    assert [m[:3] for m in caller.take()] == [[ERROR, 1, errors.PROVIDER_GONE]]
    [moved] = b.take()                                   # call 2 never started on A
    assert moved[3] == "d2"


def test_a_node_whose_acks_may_follow_keeps_its_attempts_until_the_ack_deadline():
    """Declared dead for its silence (or replaced by a new process), a node's ACK may
    still come: its unacknowledged attempts move only after their ack deadline, and only
    if this node hears the bus; an ACK that comes meanwhile keeps the call there."""
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1), (b, 1)]})
    r, caller = router(view, rand=lambda: 0.0), Peer("c")
    for cid in (1, 2, 3):
        r.request(caller, cid, "x", f"d{cid}", None, now=0.0)
    attempts = [msg[1] for msg in a.take()]
    a.closed = True
    r.drop_peer(a, now=0.5, acks_may_follow=True)
    assert caller.take() == [] and b.take() == []        # nothing moves at once
    r.ack(a, attempts[0])                                # a late ACK: it started call 1
    assert caller.take() == []
    r.drop_peer(a, now=0.6, acks_may_follow=True)        # (a replaced process: gone)
    assert [m[:3] for m in caller.take()] == [[ERROR, 1, errors.PROVIDER_GONE]]
    view.hearing = False
    r.tick(0.5)
    r.tick(1.01)                                         # the ack deadline: A is not asked,
    assert a.take() == [] and view.probes == 2           # but is this node hearing?
    r.tick(2.02)                                         # no answer, and deaf
    view.hearing = True
    assert [m[:3] for m in caller.take()] == [[ERROR, 2, errors.CLUSTER_UNAVAILABLE],
                                              [ERROR, 3, errors.CLUSTER_UNAVAILABLE]]
    assert b.take() == [] and r.pending == 0


def test_invokes_stay_local_report_accept_and_can_be_cancelled():
    view = View({"x": [(Node("A"), 5)]})
    r, origin, local = router(view), Node("origin"), Peer("p")
    r.provide(local, ["x"])
    r.request(origin, 77, "x", None, 1000, now=0.0)      # an INVOKE: never forwarded
    [req] = local.take()
    r.accept(local, req[1], now=0.0)
    assert origin.take() == [[ACCEPT, 77]]
    r.cancel_from(origin, 77)
    assert local.take() == [[CANCEL, req[1]]] and r.pending == 0 and origin.inflight == 0
    r.request(origin, 78, "unknown", None, 1000, now=0.0)
    assert origin.take()[0][:3] == [ERROR, 78, errors.NO_PROVIDER]  # the origin's REJECT


def _sequence(*values):
    """A rand() that returns ``values`` in turn."""
    it = iter(values)
    return lambda: next(it)


def test_a_draw_takes_affinity_first_attempts_of_one_batch_then_calls_draw_again():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 3), (b, 1)]})
    # picks over the total of 5 (local 1, A 3, B 1): 0.5 -> A, 0.9 -> B, 0.1 -> local
    r = router(view, affinity=3, rand=_sequence(0.5, 0.9, 0.1))
    caller, local = Peer("c"), Peer("p")
    r.provide(local, ["x"])
    r.new_batch()                     # one client frame of five calls
    for i in range(5):
        r.request(caller, i, "x", None, None, now=0.0)
    assert len(requests_to(a)) == 3 and len(requests_to(b)) == 2  # A for 3, then B drawn
    r.new_batch()                     # the next frame: B's draw ends with the last one
    r.request(caller, 5, "x", None, None, now=0.0)                 # 0.1: the local one
    assert len(requests_to(local)) == 1 and not requests_to(b)


def test_a_drawn_target_that_left_or_whose_targets_changed_is_drawn_again():
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 1)]})
    r = router(view, affinity=100, rand=_sequence(0.1, 0.9, 0.9, 0.1))
    caller, local = Peer("c"), Peer("p")
    r.provide(local, ["x"])
    r.request(caller, 1, "x", None, None, now=0.0)          # 0.1 of 2: the local provider
    assert len(requests_to(local)) == 1
    r.unprovide(local, ["x"])                               # it stops providing x
    r.request(caller, 2, "x", None, None, now=0.0)          # drawn again: A, the only one
    assert len(requests_to(a)) == 1
    view.entries["x"] = [(a, 1), (b, 1)]                    # B joined: a new targets list
    r.request(caller, 3, "x", None, None, now=0.0)          # drawn again: 0.9 of 2 -> B
    [invoke] = requests_to(b)
    # a retry never takes the round's draw: B rejects, the call moves to A
    r.reject(b, invoke[1], now=0.0)
    assert [msg[2] for msg in requests_to(a)] == ["x"] and not requests_to(b)


def test_with_affinity_every_target_stays_within_a_hold_of_its_share_at_all_times():
    import random
    a, b = Node("A"), Node("B")
    view = View({"x": [(a, 3), (b, 1)]})
    sizes = random.Random(7)
    r = router(view, affinity=8, rand=random.Random(7).random)
    caller, local = Peer("c"), Peer("p")
    r.provide(local, ["x"])
    share = {"A": 0.6, "B": 0.2, "p": 0.2}           # counts 3 and 1, and the local 1
    got, calls, worst = dict.fromkeys(share, 0), 0, dict.fromkeys(share, 0.0)
    for _ in range(3_000):             # frames of 1 to 40 calls: several draws in most
        r.new_batch()
        n = sizes.randint(1, 40)
        for i in range(n):
            r.request(caller, calls + i, "x", None, None, now=0.0)
        calls += n
        for p in (a, b, local):
            got[p.label] += len(requests_to(p))
        for name, s in share.items():
            worst[name] = max(worst[name], abs(got[name] - calls * s))
    # ~61,500 calls in lumps of up to 8: drawn at random among all targets, a target's
    # count would wander hundreds of calls from its share; drawn among those behind, it
    # is never more than a hold (8) ahead, nor more than the others' holds behind
    assert sum(got.values()) == calls
    assert max(worst.values()) < 2 * 8, worst


def test_the_counts_behind_held_draws_are_kept_for_a_bounded_number_of_names():
    from rpcbus.broker.choice import BALANCED_NAMES
    a, b = Node("A"), Node("B")
    names = [f"job.{i}" for i in range(BALANCED_NAMES + 10)]
    view = View({name: [(a, 1), (b, 1)] for name in names})
    r = router(view, affinity=4)
    caller = Peer("c")
    for i, name in enumerate(names):   # names that come and go: each called once
        r.request(caller, i, name, None, None, now=0.0)
    assert len(r.draws._balance) <= BALANCED_NAMES
    assert len(requests_to(a)) + len(requests_to(b)) == len(names)


def test_names_of_a_node_stopping_as_planned_wait_for_their_providers_to_reappear():
    handover = HandoverWait(2.0, 10.0)
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25, handover=handover)
    cache.begin_query("x", ["a"], now=0.0)
    assert cache.on_update("a", "x", 1, now=0.01)
    cache.node_gone("a", now=1.0, handover=True)         # a stops as planned
    assert cache.moving == {"x": 3.0} and cache.entries["x"].targets == []
    assert cache.on_update("b", "x", 1, now=1.5)         # it reappeared on b: calls go on
    assert cache.entries["x"].targets == [("b", 1)] and not cache.moving
    assert handover.wait == 2.0                          # quick: the floor
    cache.node_gone("b", now=2.0, handover=True)
    assert cache.expire(3.9) == ([], [])                 # still waiting for it
    assert cache.expire(4.0) == (["x"], []) and not cache.moving  # nobody came back
    # on a slow host it comes back 3.5 s later: too late for those calls, but learnt
    assert not cache.on_update("c", "x", 1, now=5.5)
    assert 3.5 < handover.wait <= 10.0, handover.wait
    cache.node_gone("c", now=6.0, handover=True)
    assert cache.moving == {"x": 6.0 + handover.wait}    # the next move waits that long
    assert cache.on_update("a", "x", 1, now=9.0)         # and is caught
    cache.node_gone("a", now=10.0)                       # without handover: no wait
    assert not cache.moving


def test_names_wait_while_their_stopping_node_drains_and_a_whole_wait_after_it_left():
    """A slow drain (its clients told late, a slow host): the handover wait runs from
    when the stopping node let its clients go, not from its first notice."""
    cache = ProviderCache(ttl=60.0, negative_ttl=1.0, query_timeout=0.25,
                          handover=HandoverWait(2.0, 10.0))
    for name, node in (("x", "a"), ("y", "b")):
        cache.begin_query(name, [node], now=0.0)
        cache.on_update(node, name, 1, now=0.0)
    cache.node_gone("a", now=1.0, handover=True)          # a and b say they stop
    cache.node_gone("b", now=1.0, handover=True)
    draining = {"a", "b"}
    assert cache.expire(5.0, draining=draining.__contains__) == ([], [])  # still draining
    draining.discard("b")                                 # b went quietly (no release):
    assert cache.expire(5.0, draining=draining.__contains__) == (["y"], [])  # its bound
    cache.released("a", now=6.0)                          # a let its clients go now
    draining.discard("a")
    assert cache.expire(7.9, draining=draining.__contains__) == ([], [])
    assert cache.on_update("c", "x", 1, now=7.5)          # its provider, 6.5 s on
    assert cache.entries["x"].targets == [("c", 1)] and not cache.moving
    cache.released("a", now=8.0)                          # nothing moves off it now
    assert not cache.moving
