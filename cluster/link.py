"""A node's place in the cluster: the bus, membership and provider cache around its router.

``ClusterLink`` is the router's ``ClusterView`` and turns cluster messages into
router events and router messages into cluster messages:

* ``RemoteNode`` is another node as the router's provider peer: a REQUEST to
  it is published as INVOKE on that node's private topic, a CANCEL as CANCEL.
* ``RemoteCaller`` is one INVOKE received from another node, as the router's
  caller peer: RESPONSE, ERROR and ACCEPT go back to the origin; a
  NO_PROVIDER outcome becomes REJECT, so the origin tries another node.

An INVOKE is only started if it is fresh, and only once Redis has taken its
ACK (so a node stopped or cut off in between never runs a call its origin
will send elsewhere): one
that waited on the way (a paused node or Redis) longer than half its ack
window is dropped unacknowledged, because its origin has given it up (or
will before an ACK could reach it) and may have sent the call elsewhere.
Its age comes from membership's per-sender clock offsets, not wall clocks.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import structlog

from broker.config import ClusterSection
from broker.router import ACK_CHECK
from clients import errors
from clients.protocol import ACCEPT, CANCEL as C_CANCEL, ERROR as C_ERROR, REQUEST, RESPONSE as C_RESPONSE

from . import messages as m
from .bus import Bus
from .membership import Membership
from .providers import ProviderCache
from .seal import Sealer

if TYPE_CHECKING:
    from broker.router import Router

log = structlog.get_logger(module="rpcbus.cluster")


class RemoteNode:
    """Another node, as a provider peer of this node's router."""

    is_node = True

    def __init__(self, link: "ClusterLink", name: str) -> None:
        self.link = link
        self.name = self.label = name
        self.topic = Bus.topic_of(name, link.config.namespace)
        self.closed = False
        self.inflight = 0
        self.provides: set[str] = set()

    def send(self, msg: list[Any]) -> None:
        if msg[0] == REQUEST:  # [16, id, name, data, left_ms, caller, sent_ms, trace?]
            invoke = [m.INVOKE, msg[1], msg[2], msg[3], msg[4], self.link.ack_ms, msg[5]]
            if len(msg) > 7:
                invoke.append(msg[7])
            self.link.bus.publish(self.topic, invoke)
        elif msg[0] == C_CANCEL:
            self.link.bus.publish(self.topic, [m.CANCEL, msg[1]])
        elif msg[0] == ACK_CHECK:
            self.link.bus.publish(self.topic, [m.CHECK, msg[1]])


class RemoteCaller:
    """One INVOKE from another node, as a caller peer of this node's router."""

    is_node = True
    closed = False  # publishing to a node that left is harmless
    provides: set[str] = set()

    __slots__ = ("link", "origin", "topic", "id", "label", "inflight", "invoke", "late_at")

    def __init__(self, link: "ClusterLink", origin: "RemoteNode", attempt: int,
                 label: str, invoke: list[Any], late_at: float) -> None:
        self.link, self.origin, self.topic = link, origin.name, origin.topic
        self.id, self.label = attempt, label
        self.inflight = 0
        self.invoke = invoke      # the INVOKE, until it starts
        self.late_at = late_at    # starting after this, the origin may have moved it on

    def start(self) -> None:
        """Redis has taken the ACK (the origin will not move the attempt now): run it."""
        link = self.link
        link.starting -= 1
        key = (self.origin, self.id)
        if link.invoked.get(key) is not self:  # cancelled meanwhile
            return
        msg, self.invoke = self.invoke, None
        t = link.loop.time()
        if t > self.late_at:
            # This process stalled before Redis took the ACK (a SIGSTOP, a starved
            # machine): the origin may have given the attempt up and moved the call on.
            # Refuse it unrun; an origin still waiting moves it now.
            del link.invoked[key]
            link.stats["stale_invokes"] += 1
            link._warn_some("late_ack_invoke_refused", origin=self.origin, rpc=msg[2],
                            call_id=self.id)
            link.bus.publish(self.topic, [m.REJECT, self.id])
            return
        link.router.request(self, self.id, msg[2], msg[3], int((msg[4] - t) * 1000), t,
                            msg[7] if len(msg) > 7 else None)

    def send(self, msg: list[Any]) -> None:
        kind = msg[0]
        topic = self.topic
        if kind == ACCEPT:
            self.link.bus.publish(topic, [m.ACCEPTED, self.id])
            return
        if kind == C_RESPONSE:
            self.link.bus.publish(topic, [m.RESPONSE, self.id, msg[2]])
        elif kind == C_ERROR and msg[2] == errors.NO_PROVIDER:
            self.link.bus.publish(topic, [m.REJECT, self.id])
        elif kind == C_ERROR:
            self.link.bus.publish(topic, [m.ERROR, self.id, msg[2], msg[3]])
        self.link.invoked.pop((self.origin, self.id), None)


class RecentIds:
    """Keys remembered for at least ``keep`` seconds (two generations of sets: adding and
    looking up cost a set operation; memory is what arrived in the last 2 x ``keep``)."""

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self._new: set[Any] = set()
        self._old: set[Any] = set()
        self._rotate_at = 0.0

    def add(self, key: Any) -> None:
        self._new.add(key)

    def __contains__(self, key: Any) -> bool:
        return key in self._new or key in self._old

    def tick(self, now: float) -> None:
        if now >= self._rotate_at:
            self._old, self._new = self._new, set()
            self._rotate_at = now + self.keep


class ClusterLink:
    """See the module docstring. ``run()`` serves the bus until cancelled."""

    def __init__(self, router: "Router", config: ClusterSection, me: str, url: str,
                 info: Any) -> None:
        self.router = router
        self.config = config
        self.me = me
        self.url = url
        self._info = info                     # () -> dict for the heartbeat
        self.ack_ms = int(router.ack_timeout * 1000)
        self.available = False
        self.state = m.STARTING
        self.started = time.time()
        self.membership = Membership(me, config.heartbeat_interval, config.heartbeat_misses)
        self.cache = ProviderCache(config.provider_cache_ttl, config.negative_ttl,
                                   config.query_timeout)
        sealer = None
        if config.seal != "none":
            sealer = Sealer(config.seal, config.keys, config.key_id, config.max_skew)
        self.bus = Bus(config.redis_url, config.namespace, me, self._on_batch,
                       self._on_up, self._on_down, sealer=sealer, max_skew=config.max_skew,
                       tls_ca=config.redis_tls_ca)
        self.nodes: dict[str, RemoteNode] = {}
        self.invoked: dict[tuple[str, int], RemoteCaller] = {}
        self.starting = 0  # INVOKEs acknowledged, waiting for Redis to take the ACK
        # (origin, attempt) of INVOKEs this node acknowledged, and of those it told a CHECK
        # it never started (a late INVOKE for one of those is dropped)
        # kept until a CHECK could still come (it leaves the origin an ack timeout after
        # the INVOKE): at most 2 x keep x INVOKEs/s entries, ~20 MB at 50k/s (ack 1 s)
        keep = 1.5 * router.ack_timeout + 0.5
        self.acked, self.refused = RecentIds(keep), RecentIds(keep)
        self._terminating: set[str] = set()
        self.stats = {"stale_invokes": 0, "nodes_dead": 0, "silent_attempts": 0,
                      "checks_refused": 0, "cache_lookups": 0, "cache_misses": 0}
        self._warned: dict[str, tuple[float, int]] = {}
        self._next_beat = 0.0
        self._last_echo = 0.0
        self._settled_at = 0.0          # until then membership may miss peers (just joined)
        router.cluster = self
        router.count_changed = self._count_changed

    # -- ClusterView ---------------------------------------------------------------------

    def targets(self, name: str, now: float, discover: bool) -> list[tuple[Any, int]] | None:
        if not self.available:
            return []
        self.stats["cache_lookups"] += 1
        entry = self.cache.entries.get(name)
        if entry is None:
            self.stats["cache_misses"] += 1
            if not discover:
                return []
            publish, done = self.cache.begin_query(name, self.membership.live(), now,
                                                   self._settled_at)
            if publish:
                self.bus.publish(self.bus.control, [m.RPC_QUERY, name])
            if not done:
                return None
            entry = self.cache.entries[name]
        peers = entry.peers
        if peers is None:
            peers = entry.peers = [(self._node(n), c) for n, c in entry.targets]
        return peers

    def knows(self, name: str) -> bool:
        return name in self.cache.entries

    def silent(self, name: str, node: Any) -> None:
        self.stats["silent_attempts"] += 1
        self._warn_some("node_silent", node=node.name, rpc=name)
        self.cache.forget_node_for(name, node.name)

    def _warn_some(self, event: str, **fields: Any) -> None:
        """A per-call warning, logged at most once a second per event with the number held
        back since (the counters in /stats have them all)."""
        now = time.monotonic()
        last, held = self._warned.get(event, (-1.0, 0))
        if now - last >= 1.0:
            log.warning(event, held_back=held, **fields)
            self._warned[event] = (now, 0)
        else:
            self._warned[event] = (last, held + 1)

    # -- life ----------------------------------------------------------------------------

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.bus.run()

    def set_state(self, state: str) -> None:
        """Announce ``ready`` or ``terminating`` now (and in every heartbeat after)."""
        self.state = state
        self._beat(asyncio.get_running_loop().time())

    def joined(self, now: float) -> bool:
        """The bus works and a first round of heartbeats has been heard."""
        return self.available and now >= self._settled_at

    def stalled(self, now: float) -> None:
        """This process was stopped or starved, not the bus or the peers: nothing could
        be heard meanwhile. Give them a fresh chance before judging."""
        self._last_echo = now
        self.membership.grace(now)

    def tick(self, now: float) -> None:
        self.acked.tick(now)
        self.refused.tick(now)
        if now >= self._next_beat:
            self._beat(now)
            if self.available and now - self._last_echo > (
                    self.config.heartbeat_interval * self.config.heartbeat_misses):
                self.bus.stale("this node's own heartbeats stopped coming back")
            for name in self.membership.expire(now):
                self._node_dead(name, now)
        for name in self.cache.expire(now):
            self.router.resume(name, now)

    def _beat(self, now: float) -> None:
        self._next_beat = now + self.config.heartbeat_interval
        self.bus.publish(self.bus.control, [m.STATE, self.state, self.url, self.started,
                                            self._info()])

    # -- bus events ----------------------------------------------------------------------

    def _on_up(self) -> None:
        now = asyncio.get_running_loop().time()
        self.available = True
        self._last_echo = now
        if not self.membership.members:  # a first join: hear a round of heartbeats first
            self._settled_at = now + 1.5 * self.config.heartbeat_interval
        self._beat(now)
        for name in self.router.provider_counts():
            self.bus.publish(self.bus.control,
                             [m.PROVIDER_UPDATE, name, self.router.advertised(name)])

    def _on_down(self, reason: str) -> None:
        now = asyncio.get_running_loop().time()
        self.available = False
        self.invoked.clear()  # unstarted INVOKEs never start; answers cannot go back anyway
        self.starting = 0
        log.warning("cluster_unavailable", reason=reason)
        self.cache = ProviderCache(self.config.provider_cache_ttl, self.config.negative_ttl,
                                   self.config.query_timeout)  # it can no longer be kept true
        self.router.cluster_down(now)

    def _count_changed(self, name: str, count: float) -> None:
        self.bus.publish(self.bus.control, [m.PROVIDER_UPDATE, name, count])

    def _on_batch(self, sender: str, sent_at: float, msgs: list[list[Any]]) -> None:
        now = asyncio.get_running_loop().time()
        if sender == self.me:
            if any(msg[0] == m.STATE for msg in msgs):
                self._last_echo = now
            return
        age = self.membership.age(sender, sent_at, now)
        for msg in msgs:
            try:
                self._on_message(sender, msg, age, sent_at, now)
            except Exception:  # a bug must cost one message, never the bus
                log.exception("cluster_message_failed", sender=sender, kind=msg[0])

    def _on_message(self, sender: str, msg: list[Any], age: float, sent_at: float,
                    now: float) -> None:
        kind = msg[0]
        router = self.router
        if kind == m.INVOKE:
            self._invoke(sender, msg, age, now)
        elif kind == m.RESPONSE:
            router.respond(self._node(sender), msg[1], msg[2])
        elif kind == m.ACK:
            router.ack(self._node(sender), msg[1])
        elif kind == m.ACCEPTED:
            router.accept(self._node(sender), msg[1], now)
        elif kind == m.REJECT:
            router.reject(self._node(sender), msg[1], now)
        elif kind == m.ERROR:
            router.provider_error(self._node(sender), msg[1], msg[3], msg[2])
        elif kind == m.CANCEL:
            caller = self.invoked.pop((sender, msg[1]), None)
            if caller is not None:
                router.cancel_from(caller, msg[1])
        elif kind == m.CHECK:
            key = (sender, msg[1])
            if key in self.acked:                   # started (or starting): wait for it
                self.bus.publish(self._node(sender).topic, [m.ACK, msg[1]])
            else:                                   # never started, and never will be
                self.refused.add(key)
                self.stats["checks_refused"] += 1
                self.bus.publish(self._node(sender).topic, [m.REJECT, msg[1]])
        elif kind == m.RPC_QUERY:  # a terminating node takes no new calls: it has none
            count = router.advertised(msg[1]) if self.state != m.TERMINATING else 0
            self.bus.publish(self.bus.control, [m.PROVIDER_UPDATE, msg[1], count])
        elif kind == m.PROVIDER_UPDATE:
            if self.cache.on_update(sender, msg[1], msg[2], now):
                router.resume(msg[1], now)
        elif kind == m.STATE:
            self._state(sender, msg, sent_at, now)

    def _invoke(self, origin: str, msg: list[Any], age: float, now: float) -> None:
        attempt, left_ms, ack_ms = msg[1], msg[4], msg[5]
        if self.state == m.TERMINATING:  # the origin will try another node at once
            self.bus.publish(self._node(origin).topic, [m.REJECT, attempt])
            return
        key = (origin, attempt)
        if age * 1000 > ack_ms / 2 or left_ms - age * 1000 <= 0 or key in self.refused:
            self.stats["stale_invokes"] += 1
            self._warn_some("stale_invoke_dropped", origin=origin, rpc=msg[2],
                            call_id=attempt, age_ms=int(age * 1000))
            return
        node = self._node(origin)
        msg[4] = now + left_ms / 1000 - age   # from here on: the call's deadline
        caller = RemoteCaller(self, node, attempt, msg[6], msg, now + ack_ms / 2000 - age)
        self.invoked[key] = caller
        self.acked.add(key)
        self.starting += 1
        self.bus.publish(node.topic, [m.ACK, attempt], then=caller.start)

    def _state(self, sender: str, msg: list[Any], sent_at: float, now: float) -> None:
        _, state, url, started, info = msg
        new = self.membership.on_state(sender, state, url, started, info, sent_at, now)
        node = self._node(sender)
        if state == m.TERMINATING:
            if sender not in self._terminating:  # heartbeats repeat it while it drains
                self._terminating.add(sender)
                log.info("node_terminating", node=sender)
                for name in self.cache.node_gone(sender, now):
                    self.router.resume(name, now)
        elif new:
            self._terminating.discard(sender)
            node.closed = False
            log.info("node_joined", node=sender, url=url, state=state)

    def _node_dead(self, name: str, now: float) -> None:
        self.stats["nodes_dead"] += 1
        log.warning("node_dead", node=name, silent_s=self.config.heartbeat_interval *
                    self.config.heartbeat_misses)
        node = self._node(name)
        node.closed = True
        for rpc in self.cache.node_gone(name, now):
            self.router.resume(rpc, now)
        self.router.drop_peer(node, now)

    def _node(self, name: str) -> RemoteNode:
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = RemoteNode(self, name)
        return node

    def snapshot(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "state": self.state,
            "members": {n: {"state": x.state, "url": x.url} for n, x in
                        self.membership.members.items()},
            "cache": {n: e.counts for n, e in self.cache.entries.items()},
            "queries_sent": self.cache.queries_sent,
            "bus": dict(self.bus.stats),
            "bus_rejected": dict(self.bus.rejected),
            **self.stats,
        }
