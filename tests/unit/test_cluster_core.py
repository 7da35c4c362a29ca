"""The cluster core (cluster/core.py ``ClusterCore``) driven with examples: two nodes'
cores, each over a real router, and a bus the test delivers by hand — each message
published reaches every core that listens to its topic (the control topic: every node,
the sender too; a node's own topic: that node) when the test says."""

import pytest

from rpcbus import errors
from rpcbus.broker.config import Config
from rpcbus.broker.router import Router
from rpcbus.cluster import messages as m
from rpcbus.cluster.core import ClusterCore
from rpcbus.protocol import ERROR, PART, RESPONSE, STREAM

from .test_router import Peer, requests_to


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Bus:
    """What the cores publish, in order, until ``deliver``."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.cores: dict[str, ClusterCore] = {}
        self.queued: list[tuple[str, str, int, list, object]] = []
        self.silent: set[str] = set()  # nodes whose messages are lost, never ticked
        self.published: list[tuple[str, str, int, list, object]] = []  # all, ever
        # messages the test holds on the way (``hold(sender, msg)`` True), in ``held``
        self.hold = lambda sender, msg: False
        self.held: list[tuple[str, str, int, list, object]] = []

    def node(self, name: str, incarnation: int, **router: object) -> ClusterCore:
        config = Config()
        config.cluster.heartbeat_interval = 0.5
        router = Router(**{"ack_timeout": 1.0, "response_timeout": 10.0, "max_timeout": 60.0,
                           "now": self.clock.now, "initial_concurrency": 1e9, **router})
        core = ClusterCore(router, config.cluster, name, f"ws://{name}", dict,
                           outbox=Outbox(self, name), clock=self.clock,
                           stale=lambda why: None, incarnation=incarnation, started=1.0)
        self.cores[name] = core
        return core

    def deliver(self, copies: int = 1) -> None:
        """Every message published so far, each in a batch of its own (``copies``
        times: a bus that delivers twice), and what they make the cores publish."""
        while self.queued:
            queued, self.queued = self.queued, []
            for sender, topic, to, msg, then in queued:
                if sender in self.silent:
                    continue
                if then is not None:
                    then()  # Redis took it
                if self.hold(sender, msg):  # and holds it on the way
                    self.held.append((sender, topic, to, msg, None))
                    continue
                batch = m.Batch(sender, self.cores[sender].incarnation, to,
                                self.clock.now, [msg], 0)
                for core in self.cores.values():
                    if core.me not in self.silent and topic in (core.control, core.private):
                        for _ in range(copies):
                            core.on_batch(batch, self.clock.now)

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        for core in self.cores.values():
            if core.me not in self.silent:
                core.tick(self.clock.now)
                core.router.tick(self.clock.now)
        self.deliver()


class Outbox:
    """The core's ``Publisher``: queues on the test's bus."""

    def __init__(self, bus: Bus, name: str) -> None:
        self.bus, self.name = bus, name
        self.unheard: dict[str, object] = {}

    def publish(self, topic, msg, then=None, to=0, hold_until=0.0) -> None:
        self.bus.queued.append((self.name, topic, to, msg, then))
        self.bus.published.append((self.name, topic, to, msg, then))

    def heard(self, topic, to) -> None:
        pass

    def expire(self) -> None:
        pass


def joined_pair() -> tuple[Bus, ClusterCore, ClusterCore, Peer]:
    """Nodes a and b have heard each other; a provider of ``f`` is on b."""
    bus = Bus()
    a, b = bus.node("a", incarnation=1), bus.node("b", incarnation=2)
    a.on_up(0.0)
    b.on_up(0.0)
    bus.deliver()
    provider = Peer("p")
    b.router.provide(provider, ["f"])
    bus.tick(1.0)  # past a first join's round of heartbeats
    assert set(a.membership.members) == {"b"} and set(b.membership.members) == {"a"}
    return bus, a, b, provider


def test_a_call_crosses_from_one_core_to_another_and_its_answer_comes_back():
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    a.router.request(caller, 7, "f", "data", None, bus.clock.now)
    bus.deliver()
    [request] = requests_to(provider)
    assert request[3] == "data" and request[5] == "c"   # the caller's label, from node a
    b.router.respond(provider, request[1], "answer")
    bus.deliver()
    assert caller.take() == [[RESPONSE, 7, "answer"]]
    assert a.router.pending == 0 and b.router.pending == 0
    assert b.invoked == {}                               # the INVOKE left b's table


def test_an_invoke_the_bus_delivers_twice_reaches_its_provider_once():
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    a.router.request(caller, 1, "f", "once", None, bus.clock.now)
    bus.deliver(copies=2)
    [request] = requests_to(provider)
    assert b.stats["duplicate_invokes"] == 1
    b.router.respond(provider, request[1], "ran once")
    bus.deliver(copies=2)
    assert caller.take() == [[RESPONSE, 1, "ran once"]]  # and once only
    assert requests_to(provider) == [] and a.router.pending == 0



def test_a_node_gone_silent_is_declared_dead_and_its_started_call_fails_not_moves():
    """b took the call (its ACK reached a), then went silent: after the heartbeat
    misses a declares b dead, and the call, which may have run there, fails with a code
    that says so; it is not sent anywhere else."""
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    a.router.request(caller, 1, "f", "d", None, bus.clock.now)
    bus.deliver()
    assert len(requests_to(provider)) == 1             # b acknowledged and started it
    bus.silent.add("b")                                # from now on
    heartbeats = a.config.heartbeat_interval * a.config.heartbeat_misses
    bus.tick(heartbeats - 0.25)
    assert caller.take() == [] and a.stats["nodes_dead"] == 0  # not yet
    bus.tick(0.5)
    assert a.stats["nodes_dead"] == 1
    assert [msg[:3] for msg in caller.take()] == [[ERROR, 1, errors.PROVIDER_GONE]]
    assert a.router.pending == 0 and "b" not in a.membership.members



@pytest.mark.parametrize("first", ["a new call", "the sweep"])
def test_calls_waiting_beyond_a_full_provider_go_to_a_node_that_came_to_provide(first):
    """a's own provider holds all it may; calls beyond it wait. When b comes to provide
    the name (it joined, or came back under its name after a restart: a node a never
    sent a call), a new call goes there, not behind them, and so do the waiting calls at
    the next sweep, whichever comes first: a slot freeing at the full provider is what
    usually hands out waiting calls, and callers that wait for their answers send
    nothing new meanwhile."""
    bus = Bus()
    a = bus.node("a", incarnation=1, policy="local-first", initial_concurrency=2)
    b = bus.node("b", incarnation=2)
    a.on_up(0.0)
    b.on_up(0.0)
    bus.tick(1.0)
    mine = Peer("mine")
    a.router.provide(mine, ["f"])
    caller = Peer("c")
    for cid in range(1, 5):
        a.router.request(caller, cid, "f", cid, None, bus.clock.now)
    bus.deliver()
    assert [r[3] for r in requests_to(mine)] == [1, 2]  # its limit; 3 and 4 wait
    theirs = Peer("theirs")
    b.router.provide(theirs, ["f"])
    bus.deliver()                                        # a hears that b provides f
    steps = [lambda: a.router.request(caller, 5, "f", 5, None, bus.clock.now),
             lambda: bus.tick(0.1)]
    for step in steps if first == "a new call" else steps[::-1]:
        step()
        bus.deliver()
        got = [r[3] for r in requests_to(theirs)]
        assert got == ([5] if step is steps[0] else [3, 4]), got
    assert requests_to(mine) == [] and caller.take() == []


# The simulator's pinned regressions (tests/sim/test_sim.py) as schedules written out: the
# same bug, reached by these steps whatever the simulator draws.

def test_an_invoke_replayed_after_its_node_began_draining_runs_once_and_is_not_refused():
    """Seed 160: b took an INVOKE and started it, then began draining, then the bus
    delivered the INVOKE again. The replay is no news: b neither runs it again nor
    refuses it, for a REJECT would tell a that the call never started there, and a
    would send it, still running on b, to another provider too."""
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    a.router.request(caller, 1, "f", "once", None, bus.clock.now)
    bus.deliver()
    [request] = requests_to(provider)                    # b acknowledged and started it
    invoke = [(sender, topic, to, msg, None) for sender, topic, to, msg, _ in bus.published
              if msg[0] == m.INVOKE]
    assert len(invoke) == 1
    b.router.drain()
    b.set_state(m.TERMINATING, bus.clock.now)
    bus.deliver()
    elsewhere = Peer("elsewhere")                         # where a would move it
    a.router.provide(elsewhere, ["f"])
    bus.queued.extend(invoke)                             # the replay, after the drain
    bus.deliver()
    assert requests_to(elsewhere) == [], "a moved a call b had started"
    assert requests_to(provider) == [] and b.stats["duplicate_invokes"] == 1
    b.router.respond(provider, request[1], "ran once")
    bus.deliver()
    assert caller.take() == [[RESPONSE, 1, "ran once"]]
    assert a.router.pending == 0 and b.router.pending == 0


def test_stream_parts_the_bus_delivers_twice_reach_their_caller_once_and_in_order():
    """Seeds 15 and 9 (with streams): every batch of a stream between nodes delivered
    twice, and a batch of parts delivered again after later ones: each part reaches the
    caller once, in order, and the stream ends once."""
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    a.router.request(caller, 1, "f", "s", None, bus.clock.now, None, 8)
    bus.deliver(copies=2)
    [stream] = [msg for msg in provider.take() if msg[0] == STREAM]
    for part in range(3):
        b.router.part(provider, stream[1], part)
    bus.deliver(copies=2)
    first = [(sender, topic, to, msg, None) for sender, topic, to, msg, _ in bus.published
             if msg[0] == m.PART]
    assert first
    for part in range(3, 6):
        b.router.part(provider, stream[1], part)
    bus.deliver(copies=2)
    bus.queued.extend(first)                              # the first parts, again, late
    bus.deliver()
    b.router.respond(provider, stream[1], None)
    bus.deliver(copies=2)
    got = caller.take()
    assert [msg[2] for msg in got if msg[0] == PART] == list(range(6))
    assert [msg for msg in got if msg[0] != PART] == [[RESPONSE, 1, None]]
    assert a.router.pending == 0 and b.router.pending == 0


@pytest.mark.parametrize("meanwhile", ["heartbeats", "a stall"])
def test_nothing_but_its_echo_proves_that_an_ack_was_not_missed(meanwhile):
    """Seeds 66 and 735: b started a's call and acknowledged it, but the ACK is held on
    the way, and so is a's ECHO (the probe sent with its CHECK, on its own topic, behind
    anything Redis took for it before). Meanwhile a's heartbeats on the control topic
    come back (66), or a's process stalls and runs again (735): neither says that
    nothing for a is still on its way. So at the second ack timeout the call is not
    moved (b runs it); it ends CLUSTER_UNAVAILABLE, and b's late ACK and answer find
    nothing to move or answer."""
    bus, a, b, provider = joined_pair()
    caller = Peer("c")
    bus.hold = lambda sender, msg: (sender == "b" and msg[0] == m.ACK) or msg[0] == m.ECHO
    a.router.request(caller, 1, "f", "once", None, bus.clock.now)
    bus.deliver()
    [request] = requests_to(provider)                      # b started it; its ACK is held
    b.router.accept(provider, request[1], bus.clock.now)   # and its provider runs it
    elsewhere = Peer("elsewhere")                          # where a would move it
    a.router.provide(elsewhere, ["f"])
    for _ in range(6):                                     # two ack timeouts, heartbeats on
        bus.tick(0.4)
        if meanwhile == "a stall":
            a.stalled(bus.clock.now)
    assert [msg[0] for *_, msg, _ in bus.held if msg[0] == m.ECHO]  # a's probe, held
    assert requests_to(elsewhere) == [], "a moved a call b had started"
    [error] = caller.take()
    assert error[:3] == [ERROR, 1, errors.CLUSTER_UNAVAILABLE]
    bus.hold = lambda sender, msg: False
    bus.queued.extend(bus.held)                            # the ACKs and the ECHO, late
    bus.deliver()
    assert requests_to(elsewhere) == [] and caller.take() == []
    b.router.respond(provider, request[1], "ran once")     # its answer: too late, dropped
    bus.deliver()
    assert caller.take() == [] and a.router.pending == 0 and b.router.pending == 0
