"""The cluster side of calls: a node's rules for other nodes. Pure: no asyncio, no sockets.

``ClusterCore`` is the router's ``ClusterView`` and turns cluster messages into
router events and router messages into cluster messages. Events come in as
method calls with ``now`` (a batch from the bus, the bus up or down, a ``tick``);
messages go out through ``outbox.publish`` (cluster/outbox.py), and what
happens once Redis has taken a message comes back as that publish's ``then``
callback, which reads ``clock``. The shell (cluster/link.py ``ClusterLink``)
runs the bus and feeds this; the simulator (rpcbus.sim) feeds the same object.

Its peers for other nodes are in cluster/peers.py (``RemoteNode``: a
provider elsewhere; ``RemoteCaller``: one INVOKE from elsewhere).

An INVOKE is only started if it is fresh, and only once Redis has taken its
ACK (so a node stopped or cut off in between never runs a call its origin
will send elsewhere): one
that waited on the way (a paused node or Redis) longer than half its ack
window is dropped unacknowledged, because its origin has given it up (or
will before an ACK could reach it) and may have sent the call elsewhere.
Its age comes from membership's per-sender clock offsets, not wall clocks.

Incarnations: every process has its own (cluster/messages.py). A batch from a
node name under a newer incarnation means that node restarted: the old
process's acknowledged attempts fail at once (PROVIDER_GONE), the others move
on, its cache entries go, and the calls it had invoked here are cancelled
(nobody is left to answer). Batches addressed to another incarnation of this
node, or sent by an older one of a live peer, are dropped and counted.

Hearing: this node moves an attempt away from a silent node, or declares a peer
dead, only while it can show that it hears the bus itself — its own batches
come back (an ECHO published after the CHECK) and no batch of that peer was
refused for its clock. A node that can publish but not hear would otherwise run
calls twice: its INVOKEs run elsewhere while their ACKs never reach it. What it
cannot settle fails with CLUSTER_UNAVAILABLE instead (docs/cluster.md).

Why one module this long (about 700 lines): every event of the cluster protocol (a
batch, a peer's restart, the bus up or down, a tick) reads and changes the same few
tables (the peers by name and incarnation, the provider cache, the proof of hearing),
and the order in which one event touches them is the rule (a restart fails the old
process's acknowledged attempts before its cache entries go). Cut by message kind,
each part would reach into the others' tables; what stands alone already lives
beside it (cluster/peers.py, providers.py, membership.py, messages.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Protocol

import structlog

from rpcbus import errors
from rpcbus.cluster import messages as m
from rpcbus.cluster.membership import Membership
from rpcbus.cluster.messages import (
    INV_ACK_LEFT_MS,
    INV_ID,
    INV_RPC,
    INV_TIME_LEFT_MS,
)
from rpcbus.cluster.peers import RecentIds, RemoteCaller, RemoteNode
from rpcbus.cluster.providers import HandoverWait, ProviderCache
from rpcbus.cluster.routing import Routing
from rpcbus.cluster.settings import ClusterSection
from rpcbus.cluster.warnings import SparseWarnings

log = structlog.get_logger(module="rpcbus.cluster")


NEWS_GAP = 0.2  # s: a heartbeat early for news (``Routing.rates_moved``) comes at most so often


class Publisher(Protocol):
    """Where the core's messages go (cluster/outbox.py ``Outbox`` is one)."""

    # answers whose PUBLISH reached nobody on a node's topic, by topic, until ``heard``
    unheard: dict[str, Any]

    def publish(self, topic: str, msg: list[Any], then: Callable[[], None] | None = ...,
                to: int = ..., hold_until: float = ...) -> None: ...
    def heard(self, topic: str, to: int) -> None: ...
    def expire(self) -> None: ...


class PresenceView(Protocol):
    """What the core feeds of the node's presence (broker/presence.py ``Presence``)."""

    def heard(self, node: str, user: str, online: bool) -> None: ...
    def heard_all(self, node: str, users: list[str]) -> None: ...
    def node_gone(self, node: str) -> None: ...
    def wants_snapshot(self, node: str, digest: Any, now: float) -> bool: ...
    def snapshot(self) -> list[Any]: ...


class ClusterCore:
    """See the module docstring.

    ``stale(why)`` is the shell's: this node sees its bus does not deliver (its own
    heartbeats stopped coming back), and the bus should reconnect. ``started`` is the
    wall-clock start (heartbeats show it); every other time is on ``clock``.
    """

    def __init__(self, router: Routing, config: ClusterSection, me: str, url: str,
                 info: Callable[[], Any], *, outbox: Publisher, clock: Callable[[], float],
                 stale: Callable[[str], None], incarnation: int, started: float) -> None:
        self.router = router
        self.config = config
        self.me = me
        self.url = url
        self._info = info                     # () -> dict for the heartbeat
        self.outbox = outbox
        self.clock = clock
        self._stale = stale
        self.control = m.control_topic(config.namespace)
        self.private = m.node_topic(me, config.namespace)
        self.ack_ms = int(router.ack_timeout * 1000)
        self.available = False
        self.state = m.STARTING
        self.started = started
        self.incarnation = incarnation
        self.membership = Membership(me, config.heartbeat_interval, config.heartbeat_misses)
        # how long calls wait for a moving name: learnt across bus sessions
        self.handover = HandoverWait(config.handover_wait,
                                     max(config.handover_wait, config.handover_wait_max))
        self.cache = ProviderCache(config.provider_cache_ttl, config.negative_ttl,
                                   config.query_timeout, self.handover)
        self.nodes: dict[str, RemoteNode] = {}   # the latest incarnation heard of each name
        # processes replaced by a newer one under their name, by (name, incarnation): what
        # they sent before they went may still arrive (an ACK on another shard)
        self._retired: dict[tuple[str, int], RemoteNode] = {}
        # INVOKEs from other nodes, by (origin's incarnation, its attempt id)
        self.invoked: dict[tuple[int, int], RemoteCaller] = {}
        self.starting = 0  # INVOKEs acknowledged, waiting for Redis to take the ACK
        # (origin, attempt) of INVOKEs this node acknowledged, and of those it told a CHECK
        # it never started (a late INVOKE for one of those is dropped)
        # kept until a CHECK could still come (it leaves the origin an ack timeout after
        # the INVOKE): at most 2 x keep x INVOKEs/s entries, ~20 MB at 50k/s (ack 1 s)
        keep = 1.5 * router.ack_timeout_max + 0.5
        self.acked, self.refused = RecentIds(keep), RecentIds(keep)
        self._terminating: set[str] = set()
        self._held: dict[str, float] = {}  # names found nobody during a handover: when
        self._handover_until = 0.0  # a node stopped as planned lately: its providers move
        self.stats = {"stale_invokes": 0, "nodes_dead": 0, "nodes_left": 0,
                      "silent_attempts": 0,
                      "checks_refused": 0, "checks_done": 0, "cache_lookups": 0, "cache_misses": 0,
                      "nodes_restarted": 0, "misaddressed": 0, "old_incarnation": 0,
                      "unsettled": 0, "announces": 0, "query_retries": 0,
                      "duplicate_invokes": 0}
        self._warnings = SparseWarnings(log, clock=clock)  # per-call, once a second at most
        self._next_beat = 0.0
        # sent_at of the latest of this process's own batches heard back on its private
        # topic: up to then, the bus delivered to this node everything Redis had taken for
        # that topic from anyone (``settled``; on a Redis Cluster the control topic may
        # sit on another shard, whose order says nothing of the private topic's)
        self._echo_at = 0.0
        self._heard_at = 0.0   # the same on any topic: this node still hears itself
        # when this node last had a fresh start at listening (the bus came up, the process
        # ran again after a stall): its own silence is judged from the later of the two,
        # but only an echo proves it heard anything
        self._listening_since = 0.0
        self._skewed: dict[str, tuple[float, float]] = {}  # peer -> (when, offset s)
        self._announce_after = 0.0
        self._settled_at = 0.0          # until then membership may miss peers (just joined)
        # an event another node's client emitted (an EVENT off the bus): its topic, data,
        # how long it was under way, its node's process and its number there (None: a
        # node that does not number them); the node's broker/events.py ``heard``
        self.on_event: Callable[[str, Any, float, int, int | None], None] = \
            lambda topic, data, age, origin, seq: None
        self.presence: PresenceView | None = None   # the node's (broker/presence.py)
        router.join(self, self._count_changed)

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
            publish, done = self.cache.begin_query(name, self.membership.answering(), now,
                                                   self._settled_at)
            if publish:
                self._query(name)
            if not done or self._hold_moving(name, now):  # asked, or its providers move
                return None
            entry = self.cache.entries[name]
        peers = entry.peers
        if peers is None:
            nodes = self.nodes
            peers = entry.peers = [(nodes[n], c) for n, c in entry.targets if n in nodes]
        if not peers and name in self.cache.moving and not self.router.providers_of(name):
            return None  # its providers are moving off a stopping node: wait for them
        return peers

    def knows(self, name: str) -> bool:
        return name in self.cache.entries

    def provided(self, name: str) -> bool:
        entry = self.cache.entries.get(name)
        return entry is not None and bool(entry.counts)

    def _query(self, name: str) -> None:
        """Publish RPC_QUERY for ``name``; its timeout runs from when Redis has it."""
        self.outbox.publish(self.control, [m.RPC_QUERY, name],
                            then=lambda: self.cache.published(name, self.clock()))

    def settled(self, node: Any, since: float) -> bool:
        """Can this node trust that ``node`` did not acknowledge an attempt it was asked
        about at ``since``? Only if it has heard back its own batch sent after that (so
        an ACK taken by Redis meanwhile would have arrived) and refused none of that
        node's batches for its clock (so none was thrown away unread)."""
        if self._echo_at < since:
            return False
        skewed = self._skewed.get(node.name)
        return skewed is None or skewed[0] < since - self.router.ack_timeout

    def probe(self) -> None:
        """Publish an ECHO to this node's own topic (after each CHECK): once it is back,
        everything Redis took for this topic before it has been delivered (``settled``)."""
        if self.available:
            self.outbox.publish(self.private, [m.ECHO], to=self.incarnation)

    def silent(self, name: str, node: Any) -> None:
        self.stats["silent_attempts"] += 1
        self._warnings.warn("node_silent", node=node.name, rpc=name)
        self.cache.forget_node_for(name, node.name)

    # -- life ----------------------------------------------------------------------------

    def set_state(self, state: str, now: float) -> None:
        """Announce ``ready`` or ``terminating`` now (and in every heartbeat after)."""
        self.state = state
        self._beat(now)

    def joined(self, now: float) -> bool:
        """The bus works and a first round of heartbeats has been heard."""
        return self.available and now >= self._settled_at

    def joined_at(self) -> float:
        """When, with the bus up, this node will have heard a first round of heartbeats."""
        return self._settled_at

    def stalled(self, now: float) -> None:
        """This process was stopped or starved, not the bus or the peers: nothing could
        be heard meanwhile. Give them a fresh chance before judging (this proves no
        hearing: ``settled`` still waits for an echo)."""
        self._listening_since = now
        self.membership.grace(now)
        self._announce(now)  # others may have declared this node dead meanwhile

    def tick(self, now: float) -> None:
        self.acked.tick(now)
        self.refused.tick(now)
        interval = self.config.heartbeat_interval
        if self.router.rates_moved and now >= self._next_beat - interval + NEWS_GAP:
            self._beat(now)   # news for the other nodes' choice: told now, not in a second
        elif now >= self._next_beat:
            self._beat(now)
            if self.outbox.unheard:  # answers for a node that never came back
                self.outbox.expire()
            heard = max(self._heard_at, self._listening_since)
            if self.available and now - heard > interval * self.config.heartbeat_misses:
                self._stale("this node's own heartbeats stopped coming back")
            # A peer is dead only when silent while this node heard itself: silence a
            # deaf node measures is its own fault (it suspects itself; the stale bus
            # above fails what it cannot settle).
            for name in self.membership.expire(min(now, heard + interval)):
                self._node_dead(name, now)
        finished, again = self.cache.expire(now, self.router.waiting, self._draining)
        for name in again:  # unknown, not "nobody": ask again while calls wait
            self.stats["query_retries"] += 1
            self._query(name)
        for name in finished:
            self._found(name, now)

    def _draining(self, node: str) -> bool:
        """``node`` said it stops, and still drains (its heartbeats come)."""
        return node in self._terminating and node in self.membership.members

    def _found(self, name: str, now: float) -> None:
        """Discovery of ``name`` ended: its waiting calls go on. Found nobody while a node
        is stopping, or within the handover wait of one that stopped (a deploy: it may
        be back already, under its name): its providers may be on their way to another
        node, and a stopping node answers 0, so the name waits for them as in a
        handover."""
        if not self._hold_moving(name, now):
            self.router.resume(name, now)

    def _hold_moving(self, name: str, now: float) -> bool:
        """True when ``name``, found nobody, is held as moving (``_found``): its calls
        keep waiting (targets), until a provider or the bound."""
        entry = self.cache.entries.get(name)
        wait = self.handover.wait
        if (entry is not None and not entry.counts and name not in self.cache.moving
                and now - self._held.get(name, -2 * wait) >= 2 * wait  # once per handover
                and (now < self._handover_until or any(
                    x.state == m.TERMINATING for x in self.membership.members.values()))):
            if len(self._held) >= 4096:
                self._held.clear()
            self._held[name] = now
            self.cache.hold(name, now)
            return True
        return False

    def _beat(self, now: float) -> None:
        self._next_beat = now + self.config.heartbeat_interval
        self.outbox.publish(self.control, [m.STATE, self.state, self.url, self.started,
                                           self._info()])

    # -- bus events ----------------------------------------------------------------------

    def on_up(self, now: float) -> None:
        """The bus (re)connected."""
        self.available = True
        self._listening_since = now
        self.membership.grace(now)  # nothing could be heard while down: judge afresh
        if not self.membership.members:  # a first join: hear a round of heartbeats first
            self._settled_at = now + 1.5 * self.config.heartbeat_interval
        self._beat(now)
        self._announce_after = 0.0
        self._announce(now)
        self.router.cluster_up(now)  # the calls at other nodes that waited are asked about

    def _announce(self, now: float) -> None:
        """Publish this node's count of every name it provides (at most once in half a
        heartbeat interval: several nodes asking at once get one announcement)."""
        if now < self._announce_after or not self.available:
            return
        self._announce_after = now + self.config.heartbeat_interval / 2
        self.stats["announces"] += 1
        for name in self.router.provider_counts():
            self.outbox.publish(self.control,
                                [m.PROVIDER_UPDATE, name, self.router.advertised(name)])

    def on_down(self, reason: str, now: float) -> None:
        """The bus session ended (it reconnects by itself)."""
        self.available = False
        # Unstarted INVOKEs never start; started ones keep their entry, so that their
        # answers (held by the bus) and a CANCEL still find them after the reconnect.
        # An unstarted one's ACK may have reached Redis all the same (its round failed
        # after Redis took it): its origin may wait for it as started. It is told after
        # the reconnect that it never ran, and a CHECK is answered so (``refused``).
        for key in [k for k, c in self.invoked.items() if c.invoke is not None]:
            caller = self.invoked.pop(key)
            self.refused.add(key)
            caller.node.publish([m.REJECT, caller.id], hold_until=caller.deadline)
        self.starting = 0
        assert all(c.invoke is None for c in self.invoked.values()), "an unstarted INVOKE kept"
        log.warning("cluster_unavailable", reason=reason)
        self.cache = ProviderCache(self.config.provider_cache_ttl, self.config.negative_ttl,
                                   self.config.query_timeout,
                                   self.handover)  # it can no longer be kept true
        self.router.cluster_down(now)

    def _count_changed(self, name: str, count: float) -> None:
        self.outbox.publish(self.control, [m.PROVIDER_UPDATE, name, count])
        if count > 0 and self.cache.reappeared(name, self.clock()):
            self.router.resume(name, self.clock())  # it moved here: its calls go on

    def on_batch(self, batch: m.Batch, now: float) -> None:
        """A batch from the bus (opened and decoded)."""
        sender = batch.sender
        if batch.to and batch.to != self.incarnation:
            # meant for an earlier process under this node's name (a late answer, its own
            # late ECHO, a replayed batch): nothing in it concerns this one
            self.stats["misaddressed"] += 1
            return
        if sender == self.me:
            if batch.incarnation == self.incarnation:
                if batch.sent_at > self._heard_at:
                    self._heard_at = batch.sent_at
                if batch.to and batch.sent_at > self._echo_at:  # the private topic
                    self._echo_at = batch.sent_at
            else:
                self._warnings.warn("duplicate_node_name", node=sender,
                                hint="two processes run under this node name: give each "
                                     "node its own --name")
            return
        node = self._peer(sender, batch.incarnation, now)
        if node is None:
            return
        if self.outbox.unheard and node.topic in self.outbox.unheard and not node.retired:
            self.outbox.heard(node.topic, node.incarnation)  # it listens again: its answers
        age = self.membership.age(sender, batch.sent_at, now)
        addressed = batch.to == self.incarnation  # call messages come only in these
        taken: list[RemoteCaller] = []  # the batch's INVOKEs taken: one ACK for them all
        respond = self.router.respond
        for msg in batch.messages:
            kind = msg[0]
            if not addressed and kind in m.CALL_KINDS:
                self.stats["misaddressed"] += 1
                continue
            try:
                if kind == m.RESPONSE:  # the two kinds every call carries, first
                    respond(node, msg[1], msg[2])
                elif kind == m.INVOKE:
                    self._invoke(node, msg, age, now, taken)
                elif kind == m.PART:
                    self.router.part(node, msg[1], msg[3], msg[2])
                elif kind == m.INVOKE_ALL:
                    self._invoke(node, msg, age, now, taken)
                elif kind == m.EVENT:  # on an event channel: for this node's subscribers
                    self.on_event(msg[1], msg[2], age, node.incarnation,
                                  msg[3] if len(msg) > 3 else None)
                else:
                    self._on_message(node, msg, batch.sent_at, now)
            except Exception:  # a bug must cost one message, never the bus
                log.exception("cluster_message_failed", sender=sender, kind=msg[0])
        if taken:
            node.publish([m.ACK, *[caller.id for caller in taken]],
                         then=partial(_start_all, taken))
        if node.retired:  # a late batch of a replaced process: what it acknowledged ran,
            self.router.drop_peer(node, now, acks_may_follow=True)  # and nothing follows

    def _on_message(self, node: RemoteNode, msg: list[Any], sent_at: float,
                    now: float) -> None:
        kind = msg[0]  # RESPONSE and INVOKE: _on_batch takes them itself
        router = self.router
        if kind == m.ACK:
            router.ack(node, *msg[1:])
        elif kind == m.REJECT:
            router.reject(node, msg[1], now)
        elif kind == m.ERROR and msg[2] == errors.OVERLOADED:  # its providers were all busy
            router.reject(node, msg[1], now, "BUSY")  # (not run): another node, or wait
        elif kind == m.ERROR:
            router.provider_error(node, msg[1], msg[3], msg[2],
                                  msg[4] if len(msg) > 4 else None)
        elif kind == m.CANCEL:
            caller = self.invoked.pop((node.incarnation, msg[1]), None)
            if caller is not None:
                router.cancel_from(caller, msg[1])
        elif kind == m.REPLY:  # one provider's answer to a call_all sent to ``node``
            router.reply(node, msg[1], msg[2], msg[3], msg[4] if len(msg) > 4 else None)
        elif kind == m.CREDIT:  # a stream's caller on ``node`` has read this many parts
            caller = self.invoked.get((node.incarnation, msg[1]))
            if caller is not None:
                router.credit(caller, msg[1], msg[2])
        elif kind == m.CHECK:
            self._check(node, msg, sent_at, now)
        elif kind == m.DONE:
            router.lost(node, msg[1])
        elif kind == m.RPC_QUERY:  # a terminating node takes no new calls: it has none
            count = router.advertised(msg[1]) if self.state != m.TERMINATING else 0
            if count:  # news for every node's cache
                self.outbox.publish(self.control, [m.PROVIDER_UPDATE, msg[1], count])
            else:  # only the asker needs it (the others' entries lack this node already):
                # one delivery instead of one per node, so a query costs O(nodes), not O(n²)
                node.publish([m.PROVIDER_UPDATE, msg[1], 0])
        elif kind == m.PROVIDER_UPDATE:
            if self.cache.on_update(node.name, msg[1], msg[2], now):
                self._found(msg[1], now)
        elif kind == m.STATE:
            self._state(node, msg, sent_at, now)
        elif kind == m.ANNOUNCE:
            self._announce(now)
        elif kind == m.PRESENCE or kind == m.PRESENCE_ALL:  # a replaced process's: past
            if self.presence is not None and not node.retired:
                if kind == m.PRESENCE:
                    self.presence.heard(node.name, msg[1], msg[2])
                else:
                    self.presence.heard_all(node.name, msg[1])
        elif self.presence is not None and kind == m.PRESENCE_QUERY:
            self.outbox.publish(self.control, self.presence.snapshot())

    def _check(self, node: RemoteNode, msg: list[Any], sent_at: float, now: float) -> None:
        """``node`` asks what became of its attempt ``msg[1]`` here: ACK while it runs (or
        starts), REJECT if it never started (and now never will), DONE if it ran and was
        answered (the answer went out before this DONE, on the same topic: if it is not
        there first, it was lost).

        An attempt this node does not remember (``acked`` keeps keys for ``keep``
        seconds) is one it never received, unless the origin had its ACK (``age_ms`` -1)
        or asks about it after a bus reset later than this node remembers: then it is
        taken as run (DONE, may have run), never refused."""
        attempt = msg[1]
        key = (node.incarnation, attempt)
        if key in self.invoked:
            node.publish([m.ACK, attempt])
        elif key in self.refused:
            self.stats["checks_refused"] += 1
            node.publish([m.REJECT, attempt])
        elif key in self.acked or (len(msg) > 2 and (
                msg[2] < 0 or msg[2] / 1000 + self.membership.age(node.name, sent_at, now)
                >= self.acked.keep)):
            self.stats["checks_done"] += 1
            node.publish([m.DONE, attempt])
        else:                                   # never started, and never will be
            self.refused.add(key)
            self.stats["checks_refused"] += 1
            node.publish([m.REJECT, attempt])

    def _invoke(self, node: RemoteNode, msg: list[Any], age: float, now: float,
                taken: list[RemoteCaller]) -> None:
        """Take an INVOKE if fresh: added to ``taken``, it starts once Redis has the ACK
        that names it (published for the whole batch by ``_on_batch``)."""
        attempt, left_ms, ack_ms = msg[INV_ID], msg[INV_TIME_LEFT_MS], msg[INV_ACK_LEFT_MS]
        if node.retired:  # its origin process is gone: nobody waits for the answer
            self.stats["stale_invokes"] += 1
            return
        key = (node.incarnation, attempt)
        acked, refused = self.acked, self.refused  # (``key in``, inlined: see RecentIds)
        if key in acked.new or key in acked.old:  # delivered twice (a replay): runs once
            self.stats["duplicate_invokes"] += 1  # (before the check below: a replay of
            return                                # one taken before draining is no news)
        if self.state == m.TERMINATING:  # the origin will try another node at once
            node.publish([m.REJECT, attempt])
            return
        if (age * 1000 > ack_ms / 2 or left_ms - age * 1000 <= 0
                or ((refused.new or refused.old) and key in refused)):  # rarely any
            self.stats["stale_invokes"] += 1
            self._warnings.warn("stale_invoke_dropped", origin=node.name, rpc=msg[INV_RPC],
                            call_id=attempt, age_ms=int(age * 1000))
            return
        caller = RemoteCaller(self, node, key, msg, now + left_ms / 1000 - age,
                              now + ack_ms / 2000 - age)
        assert key not in self.invoked, "an INVOKE taken twice"  # (``acked`` said it)
        self.invoked[key] = caller
        self.acked.add(key)
        self.starting += 1
        taken.append(caller)

    def _state(self, node: RemoteNode, msg: list[Any], sent_at: float, now: float) -> None:
        _, state, url, started, info = msg
        sender = node.name
        node.reported = _figures(info, "served")
        node.latency = _figures(info, "latency")
        new = self.membership.on_state(sender, state, url, started, info, sent_at, now)
        if self.presence is not None and self.presence.wants_snapshot(
                sender, info.get("presence"), now):
            node.publish([m.PRESENCE_QUERY])  # what it said of its users was not all heard
        if state == m.TERMINATING:
            if sender not in self._terminating:  # heartbeats repeat it while it drains
                self._terminating.add(sender)
                self._handover_until = max(self._handover_until, now + self.handover.wait)
                log.info("node_terminating", node=sender)
                for name in self.cache.node_gone(sender, now, handover=True):
                    self.router.resume(name, now)
        elif new:
            self._terminating.discard(sender)
            node.closed = False
            log.info("node_joined", node=sender, url=url, state=state)
            # New, restarted or back from the dead (a pause): what it provides may be
            # missing from every entry here. Ask it to announce its counts.
            node.publish([m.ANNOUNCE])

    def _peer(self, name: str, incarnation: int, now: float) -> RemoteNode | None:
        """The peer object for a batch from ``name``'s process ``incarnation``; None for a
        batch from an earlier process of a live peer (dropped). A newer incarnation
        replaces the old one (``_replaced``)."""
        node = self.nodes.get(name)
        if node is None:
            node = self.nodes[name] = RemoteNode(self, name, incarnation)
            return node
        if incarnation == node.incarnation:
            return node
        retired = self._retired.get((name, incarnation))
        if retired is not None:  # a replaced process's late ACKs and answers still count
            return retired
        if incarnation < node.incarnation and not node.closed:
            self.stats["old_incarnation"] += 1
            return None
        self._replaced(node, now)
        assert not any(c.node is node for c in self.invoked.values()), "the old one's calls"
        node = self.nodes[name] = RemoteNode(self, name, incarnation)
        return node

    def _replaced(self, old: RemoteNode, now: float) -> None:
        """``old``'s process is gone: a new one runs under its name. Every attempt it
        acknowledged fails now (PROVIDER_GONE: it may have run); the others move at their
        ack deadline if this node heard the bus since (an ACK of the old process, on this
        node's private topic, may still follow the news, on the control topic: then it
        fails PROVIDER_GONE). Its entries leave the provider cache, and calls it invoked
        here are cancelled (nobody waits for them)."""
        if old.name in self._terminating:  # stopped as planned, started again
            if not old.closed:  # not yet counted as left (restarted within its misses)
                self.stats["nodes_left"] += 1
            log.info("node_rejoined", node=old.name)
            self.cache.released(old.name, now)
            # restarted at once (a deploy): its providers may still be on their way
            self._handover_until = max(self._handover_until, now + self.handover.wait)
        else:
            self.stats["nodes_restarted"] += 1
            log.warning("node_restarted", node=old.name)
        old.closed = old.retired = True
        if len(self._retired) >= 1024:
            self._retired.clear()
        self._retired[(old.name, old.incarnation)] = old
        self.membership.forget(old.name)
        if self.presence is not None:  # the old process's users left with it
            self.presence.node_gone(old.name)
        self._terminating.discard(old.name)
        self._skewed.pop(old.name, None)
        for rpc in self.cache.node_gone(old.name, now):
            self.router.resume(rpc, now)
        # its ACKs come on this node's private topic, the news of the new process on the
        # control topic: on a Redis Cluster, another shard, so an ACK may still follow
        self.router.drop_peer(old, now, acks_may_follow=True)
        for key, caller in [(k, c) for k, c in self.invoked.items() if c.node is old]:
            del self.invoked[key]
            self.router.cancel_from(caller, caller.id)
        assert old.name not in self.membership.members, "a replaced process still a member"

    def on_skew(self, sender: str, offset_s: float, now: float) -> None:
        """The bus refused a genuine batch of ``sender`` for its clock. What that node
        says is lost on the way here, so nothing about it can be settled: its attempts
        fail (CLUSTER_UNAVAILABLE) rather than move, and it leaves the provider cache.
        Done at most once a second per node; logged, shown by ``/readyz``."""
        last = self._skewed.get(sender)
        self._skewed[sender] = (now, offset_s)
        if last is not None and now - last[0] < 1.0:
            return
        self._warnings.warn("clock_skew", node=sender, offset_s=round(offset_s, 3),
                        max_skew_s=self.config.max_skew,
                        hint="its batches are refused; keep the nodes' clocks in sync (NTP)")
        for rpc in self.cache.node_gone(sender, now):
            self.router.resume(rpc, now)
        node = self.nodes.get(sender)
        if node is not None:
            self.router.fail_peer(node, errors.CLUSTER_UNAVAILABLE,
                                  f"node {sender}'s clock is {offset_s:+.1f} s off this "
                                  "node's: its answers cannot be read")

    def unencodable(self, topic: str, to: int, msg: list[Any], why: str) -> None:
        """The bus could not send ``msg`` (data nested too deeply, or too large, to cross
        it: ``why``): the call still gets its one outcome, at once, from this node — the
        sender's edge."""
        kind = msg[0]
        if kind == m.INVOKE:  # a call of a client of this node: refused before it ran
            node = self.nodes.get(topic.rsplit(":", 1)[1])
            if node is not None and node.incarnation == to:
                self.router.refuse_attempt(node, msg[1], errors.INVALID_MESSAGE,
                                           f"the call's data is {why}")
        elif kind == m.RESPONSE:  # an answer of a provider here: the caller hears why
            self.outbox.publish(topic, [m.ERROR, msg[1], errors.PROVIDER_ERROR,
                                        f"the provider's answer is {why}"], to=to)
        elif kind == m.PART:  # a part of a stream served here: it ends, its provider is
            caller = self.invoked.pop((to, msg[1]), None)  # cancelled, the caller hears why
            if caller is not None:
                self.router.cancel_from(caller, msg[1])
            self.outbox.publish(topic, [m.ERROR, msg[1], errors.PROVIDER_ERROR,
                                        f"a part of the stream is {why}"], to=to)

    def clock_problem(self, now: float) -> str | None:
        """Why this node's clock looks wrong, for ``/readyz``; None when it looks right.

        A node whose batches this one refuses for their stamps is skewed against it; when
        that is most of the nodes heard lately (or the only one), the odd clock is likely
        this node's, so it is not ready."""
        window = 3 * self.config.heartbeat_interval * self.config.heartbeat_misses
        skewed = {n: off for n, (at, off) in self._skewed.items() if now - at < window}
        if not skewed:
            return None
        heard = set(self.membership.members) | set(skewed)
        if 2 * len(skewed) <= len(heard) and len(heard) > 1:
            return None
        worst = max(skewed.values(), key=abs)
        return (f"clock skew: batches of {len(skewed)} of {len(heard)} nodes refused, "
                f"their clocks up to {worst:+.1f} s off this node's "
                f"(cluster.max_skew {self.config.max_skew:g} s): sync the clocks (NTP)")

    def _node_dead(self, name: str, now: float) -> None:
        assert name not in self.membership.members, "a dead node still a member"
        if name in self._terminating:  # it said it was stopping: a planned leave (kept
            self.stats["nodes_left"] += 1  # there until it rejoins or is replaced)
            log.info("node_left", node=name)
            self.cache.released(name, now)  # its clients were let go: they move now
            self._handover_until = max(self._handover_until, now + self.handover.wait)
        else:
            self.stats["nodes_dead"] += 1
            log.warning("node_dead", node=name, silent_s=self.config.heartbeat_interval *
                        self.config.heartbeat_misses)
        if self.presence is not None:  # its users left with it
            self.presence.node_gone(name)
        # its providers may reconnect to another node (or it was only too slow to hear):
        # calls to the names it leaves without a provider wait for one, as in a handover
        for rpc in self.cache.node_gone(name, now, handover=True):
            self.router.resume(rpc, now)
        node = self.nodes.get(name)
        if node is not None:
            skewed = self._skewed.get(name)
            if skewed is not None and now - skewed[0] < 2 * self.config.heartbeat_interval * (
                    self.config.heartbeat_misses):
                # not silent but unreadable (its clock): what it acknowledged may have been
                # thrown away here, so nothing moves
                self.router.fail_peer(node, errors.CLUSTER_UNAVAILABLE,
                                      f"node {name}'s messages cannot be read here (clock skew)")
            node.closed = True
            self.router.drop_peer(node, now, acks_may_follow=True)  # it may only be paused

    def snapshot(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "state": self.state,
            "incarnation": self.incarnation,
            "clock_skew": {n: round(off, 3) for n, (_, off) in self._skewed.items()},
            "members": {n: {"state": x.state, "url": x.url} for n, x in
                        self.membership.members.items()},
            "cache": {n: e.counts for n, e in self.cache.entries.items()},
            "queries_sent": self.cache.queries_sent,
            **self.stats,
        }


def _start_all(callers: list[RemoteCaller]) -> None:
    """Redis has taken the ACK naming these INVOKEs: start each (``RemoteCaller.start``)."""
    for caller in callers:
        caller.start()


def _figures(info: Any, key: str) -> dict[str, float]:
    """A heartbeat's ``key`` map of rpc name to a number (``served`` rates, ``latency``
    seconds): what is not one is left out."""
    got = info.get(key) if type(info) is dict else None
    return {k: v for k, v in got.items() if type(k) is str and type(v) in (int, float)
            and 0 <= v < 1e9} if type(got) is dict else {}
