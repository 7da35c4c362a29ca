"""The node's presence core (broker/presence.py): counts across connections and nodes,
what is published, the digest that heals a missed message, and who is told what."""

from rpcbus.broker.presence import ASK_EVERY, Presence
from rpcbus.cluster.messages import PRESENCE, PRESENCE_ALL


class Watcher:
    def __init__(self, sees=lambda user: True):
        self.told = []
        self.sees = sees

    def presence_changed(self, user, online):
        self.told.append((user, online))

    def may_see(self, user):
        return self.sees(user)


def test_a_user_is_online_while_any_connection_on_any_node_is():
    published = []
    p = Presence(published.append)
    everyone, of_bob, picky = Watcher(), Watcher(), Watcher(lambda u: u != "bob")
    p.watch(everyone, None)
    p.watch(of_bob, ["bob"])
    p.watch(picky, None)
    p.login("bob")
    p.login("bob")                        # a second connection here: nothing new
    p.heard("n2", "bob", True)            # and one on n2
    p.heard("n2", "ann", True)
    p.logout("bob")
    p.logout("bob")                       # still on n2
    assert published == [[PRESENCE, "bob", True], [PRESENCE, "bob", False]]
    assert p.online("bob") and p.everyone() == ["ann", "bob"]
    p.heard_all("n2", ["ann"])            # n2's whole set: bob left there too
    p.node_gone("n2")                     # and n2 died: ann with it
    assert everyone.told == [("bob", True), ("ann", True), ("bob", False), ("ann", False)]
    assert of_bob.told == [("bob", True), ("bob", False)]
    assert picky.told == [("ann", True), ("ann", False)]
    assert p.everyone() == [] and p.where == {}
    p.gone(everyone)
    p.gone(of_bob)
    p.gone(picky)
    assert p.watching == {}


def test_a_digest_that_disagrees_asks_for_the_whole_set_once_in_a_while():
    here, there = Presence(), Presence()
    for user in ("a", "b", "c"):
        there.login(user)
    here.heard("n2", "a", True)           # b's and c's PRESENCE were lost
    assert here.wants_snapshot("n2", there.digest(), now=10.0)
    assert not here.wants_snapshot("n2", there.digest(), now=10.0 + ASK_EVERY / 2)
    assert there.snapshot() == [PRESENCE_ALL, ["a", "b", "c"]]
    here.heard_all("n2", there.snapshot()[1])
    assert not here.wants_snapshot("n2", there.digest(), now=100.0)   # agrees now
    assert not here.wants_snapshot("n2", None, now=100.0)             # an older node
    there.logout("b")
    here.heard("n2", "b", False)
    assert here.digest() == [0, 0] and not here.wants_snapshot("n2", there.digest(), 200.0)
