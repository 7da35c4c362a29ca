"""The ``local-first`` policy (broker/choice.py) through the real router: calls stay on
their node while its providers have room, spill by load when they do not, and a slow
provider loses its share."""

import random
from collections import Counter

from rpcbus.broker.router import Router
from rpcbus.protocol import REQUEST
from tests.unit.test_cluster_pure import Node, View
from tests.unit.test_router import Peer


def node(label):
    n = Node(label)
    n.reported = {}
    n.latency = {}
    return n


def local_first(view=None):
    # the choice alone: no target ever holds its limit here (admission has its own tests)
    return Router(ack_timeout=60.0, response_timeout=60.0, max_timeout=60.0, now=0.0,
                  cluster=view, policy="local-first", rand=random.Random(1).random,
                  initial_concurrency=1e9)


def calls_to(peers):
    """Attempt ids sent to each peer since the last look."""
    return {p: [m[1] for m in p.take() if m[0] == REQUEST] for p in peers}


def test_calls_stay_on_their_node_while_the_cluster_is_as_busy():
    """Every node serving as many calls per second, as quickly (as its heartbeats say):
    no call crosses, however many are outstanding here."""
    n2, n3 = node("n2"), node("n3")
    r = local_first(View({"f": [(n2, 1), (n3, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    due, sent = [], 0
    for i in range(400):  # 4 s, 10 calls every 10 ms, each answered 50 ms later
        now = i / 100
        r.read_at = now
        r.tick(now)
        n2.reported = n3.reported = {"f": here.rate}
        n2.latency = n3.latency = {"f": 0.05}
        for k in range(10):
            r.request(caller, i * 10 + k, "f", None, None, now=now)
        got = calls_to([here, n2, n3])
        assert not got[n2] and not got[n3], (now, here.lat, here.rate)
        sent += len(got[here])
        due += [(now + 0.05, a) for a in got[here]]
        while due and due[0][0] <= now:
            r.respond(here, due.pop(0)[1], None)
    assert sent == 4000 and here.load >= 40
    assert (r.stats.local_calls, r.stats.remote_calls) == (4000, 0)


def test_with_callers_on_one_node_calls_spill_evenly_once_it_serves_over_its_share():
    """The other nodes idle (their heartbeats say so) and as quick: calls stay here while
    the rate is quiet, then spill, spread evenly by what is outstanding at each node."""
    n2, n3, n4 = node("n2"), node("n3"), node("n4")
    r = local_first(View({"f": [(n2, 1), (n3, 1), (n4, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    due = []
    for i in range(400):  # 100 calls a second; here answers in 10 ms, the others never
        now = i / 100
        r.read_at = now
        r.tick(now)
        n2.latency = n3.latency = n4.latency = {"f": 0.01}
        r.request(caller, i, "f", None, None, now=now)
        due += [(now + 0.01 - 1e-9, a) for a in calls_to([here])[here]]
        while due and due[0][0] <= now:
            r.respond(here, due.pop(0)[1], None)
    remote = [n2.load, n3.load, n4.load]
    assert r.stats.local_calls > 50 and sum(remote) > 50, (r.stats.local_calls, remote)
    assert max(remote) - min(remote) <= 2, remote   # a draw by weight: about ± 8
    assert r.stats.local_calls + r.stats.remote_calls == 400


def test_a_slow_provider_loses_its_share():
    """Two providers here, 20 calls in flight; ``slow`` answers one call for every ten
    ``fast`` answers: it gets a small share (with one draw by weight: half)."""
    r = local_first()
    fast, slow, caller = Peer("fast"), Peer("slow"), Peer("c")
    r.provide(fast, ["f"])
    r.provide(slow, ["f"])
    pending = {fast: [], slow: []}
    served = Counter()
    cid = 0
    for step in range(2200):
        while caller.inflight < 20:
            cid += 1
            r.request(caller, cid, "f", None, None, now=0.0)
        for p, ids in calls_to([fast, slow]).items():
            pending[p] += ids
        p = slow if step % 11 == 10 else fast
        if pending[p]:
            r.respond(p, pending[p].pop(0), None)
            served[p.label] += 1
    assert served["slow"] / sum(served.values()) < 0.1, served


def test_a_node_whose_provider_turns_slow_sends_its_calls_away_and_tries_it_again():
    """One provider here, two other nodes as busy whose providers take 10 ms (their
    heartbeats say so). Ours takes 10 ms, then 100 ms for three seconds, then 10 ms
    again: its node's calls leave it within a second, and come back once it is quick
    (it is tried again when its latency, shrinking while idle, is under the bound)."""
    n2, n3 = node("n2"), node("n3")
    r = local_first(View({"f": [(n2, 1), (n3, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    due = []                    # (when it ends, the peer, the attempt)
    went = Counter()            # (second, to here) -> first attempts
    cid = 0
    for step in range(1000):    # 10 s in steps of 10 ms, 5 calls a step
        now = step / 100
        r.read_at = now         # as the node's shell sets it, per frame and tick
        r.tick(now)
        n2.reported = n3.reported = {"f": here.rate}
        n2.latency = n3.latency = {"f": 0.01}
        for _ in range(5):
            cid += 1
            r.request(caller, cid, "f", None, None, now=now)
        delay = 0.1 if 1 <= now < 4 else 0.01
        for p, ids in calls_to([here, n2, n3]).items():
            due += [(now + (delay if p is here else 0.01) - 1e-9, p, a) for a in ids]
            went[(int(now), p is here)] += len(ids)
        for entry in [d for d in due if d[0] <= now]:
            due.remove(entry)
            r.respond(entry[1], entry[2], None)

    def here_share(second):
        return went[(second, True)] / (went[(second, True)] + went[(second, False)])
    assert here_share(0) > 0.9                      # quick: its node's calls stay
    assert here_share(2) < 0.05 and here_share(3) < 0.05, went   # slow: they leave
    assert here_share(6) > 0.9, went                # quick again: they come back


def test_a_stall_of_a_few_ms_sends_no_call_away():
    """One provider here and two other nodes, all answering in 10 ms (as their
    heartbeats say); every half second ours stalls for 30 ms (a busy machine, a GC
    pause), answering what fell due in it at its end. Its ``lat`` jumps past 2.5 times
    the others' at each stall; its node's calls stay all the same."""
    n2, n3 = node("n2"), node("n3")
    r = local_first(View({"f": [(n2, 1), (n3, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    due, peak = [], 0.0
    for step in range(1000):    # 5 s in steps of 5 ms, 5 calls a step
        now = step / 200
        r.read_at = now
        r.tick(now)
        n2.reported = n3.reported = {"f": here.rate}
        n2.latency = n3.latency = {"f": 0.01}
        for k in range(5):
            r.request(caller, step * 5 + k, "f", None, None, now=now)
        due += [(now + 0.01 - 1e-9, a) for a in calls_to([here])[here]]
        if now % 0.5 < 0.03 and now > 0.5:
            continue            # stalled: nothing answered
        while due and due[0][0] <= now:
            r.respond(here, due.pop(0)[1], None)
        peak = max(peak, here.lat)
    assert peak > 0.025 and r.stats.remote_calls == 0, (peak, r.stats.remote_calls)


def test_weights_scale_the_draw_and_the_room():
    """A local provider of weight 3 beside one of weight 1 gets about 3 in 4 calls."""
    class Weights:
        def of(self, name, provider):
            return 3.0 if provider == "big" else 1.0
    r = local_first()
    r.set_weights(Weights())
    big, small, caller = Peer("big"), Peer("small"), Peer("c")
    big.provider_name, small.provider_name = "big", "small"
    r.provide(big, ["f"])
    r.provide(small, ["f"])
    for i in range(400):
        r.request(caller, i, "f", None, None, now=0.0)
    assert 2.5 <= big.load / small.load <= 3.5, (big.load, small.load)


def test_retries_leave_out_the_targets_tried():
    n2 = node("n2")
    r = local_first(View({"f": [(n2, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    r.request(caller, 1, "f", None, None, now=0.0)
    [attempt] = calls_to([here])[here]
    r.reject(here, attempt, 0.0)
    assert len(calls_to([n2])[n2]) == 1 and here.load == 0 and n2.load == 1
