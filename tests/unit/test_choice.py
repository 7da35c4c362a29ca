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
    return n


def local_first(view=None):
    return Router(ack_timeout=60.0, response_timeout=60.0, max_timeout=60.0, now=0.0,
                  cluster=view, policy="local-first", rand=random.Random(1).random)


def calls_to(peers):
    """Attempt ids sent to each peer since the last look."""
    return {p: [m[1] for m in p.take() if m[0] == REQUEST] for p in peers}


def test_calls_stay_on_their_node_while_the_cluster_is_as_busy():
    """Every node serving as many calls per second (as its heartbeats say): no call
    crosses, however many are outstanding here."""
    n2, n3 = node("n2"), node("n3")
    r = local_first(View({"f": [(n2, 1), (n3, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    for i in range(40):
        r.tick(i / 100)
        n2.reported = n3.reported = {"f": here.rate}
        r.request(caller, i, "f", None, None, now=i / 100)
    sent = calls_to([here, n2, n3])
    assert len(sent[here]) == 40 and not sent[n2] and not sent[n3]
    assert (r.stats.local_calls, r.stats.remote_calls) == (40, 0)


def test_with_callers_on_one_node_calls_spill_evenly_once_it_serves_over_its_share():
    """The other nodes idle (their heartbeats say so): calls stay here while the rate is
    quiet, then spill, spread evenly by what is outstanding at each node."""
    n2, n3, n4 = node("n2"), node("n3"), node("n4")
    r = local_first(View({"f": [(n2, 1), (n3, 1), (n4, 1)]}))
    here, caller = Peer("p"), Peer("c")
    r.provide(here, ["f"])
    for i in range(400):  # 100 calls a second, none answered; the tick measures rates
        r.tick(i / 100)
        r.request(caller, i, "f", None, None, now=i / 100)
    remote = [n2.load, n3.load, n4.load]
    assert 0 < here.load < 300 and max(remote) - min(remote) <= 1, (here.load, remote)
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


def test_weights_scale_the_draw_and_the_room():
    """A local provider of weight 3 beside one of weight 1 gets about 3 in 4 calls."""
    class Weights:
        def of(self, name, provider):
            return 3.0 if provider == "big" else 1.0
    r = local_first()
    r.weights = Weights()
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
