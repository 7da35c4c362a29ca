"""Where the bus's topics live: one Redis, or the shards of a Redis Cluster.

``open_links()`` opens one bus session's connections and subscribes them:

- One Redis (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``): a
  connection that publishes (PUBLISH) and one subscribed (SUBSCRIBE) to the
  session's topics.
- Redis Cluster (``redis+cluster://``; cluster/redisconn.py): sharded pub/sub
  (Redis >= 7.0). A channel lives in the hash slot of its name (CRC16 mod 16384,
  redis-py's ``key_slot``), served by that slot's master: SPUBLISH goes there and
  SSUBSCRIBE is made there. The slot map comes from ``CLUSTER SLOTS`` of the
  first seed (or node known from the previous map) that answers. The session
  opens one publishing and one subscribed connection per master (topics are
  subscribed to and left during a session: event channels, ``Links.listen``);
  private node topics hash to different slots, so the nodes' traffic spreads
  over the shards.

A slot that moves (a reshard: Redis unsubscribes the channel, ``SlotMoved``; or
a SPUBLISH answered ``MOVED``) or a master lost (its connections close) ends
the session like any Redis fault: the bus reconnects with backoff, reads the
slot map afresh, subscribes where the slots now live, and its owner announces
itself again (cluster/bus.py). While the map names a master that does not
answer (a failover under way) connecting fails and is retried.

Cancelling ``open_links()`` leaves no connection open; ``close()`` closes all.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable

from redis.crc import key_slot

from rpcbus.cluster import resp
from rpcbus.cluster.redisconn import (
    NotOnLoopback,
    is_cluster,
    parse_cluster_url,
    require_loopback,
)
from rpcbus.cluster.resp import RespConnection

Address = tuple[str, int]


class ClusterUnavailable(ConnectionError):
    """The Redis Cluster cannot serve the bus now (no seed answers, a slot has no master)."""


@dataclass(frozen=True)
class SlotMap:
    """Which master serves which hash slots (``CLUSTER SLOTS``); pure."""

    starts: list[int]                 # sorted first slots of the ranges
    ranges: list[tuple[int, Address]]  # (last slot, master) of each range, same order
    nodes: list[Address] = field(default_factory=list)  # masters and replicas

    @classmethod
    def parse(cls, reply: list[Any], asked: Address) -> "SlotMap":
        """From a ``CLUSTER SLOTS`` reply read from ``asked`` (a node that announces no
        host is reached at the address it was asked on)."""
        entries = []
        nodes: list[Address] = []
        for entry in reply:
            first, last, *servers = entry
            addresses = [(host.decode() if host else asked[0], int(port))
                         for host, port, *_ in servers]
            entries.append((int(first), int(last), addresses[0]))
            nodes += [a for a in addresses if a not in nodes]
        entries.sort()
        return cls([e[0] for e in entries], [(e[1], e[2]) for e in entries], nodes)

    def owner(self, channel: str) -> Address:
        """The master serving ``channel``'s slot; ClusterUnavailable if none does."""
        slot = key_slot(channel.encode())
        i = bisect_right(self.starts, slot) - 1
        if i < 0 or self.ranges[i][0] < slot:
            raise ClusterUnavailable(f"no Redis Cluster master serves slot {slot} "
                                     f"(of {channel})")
        return self.ranges[i][1]

    def masters(self) -> list[Address]:
        seen: list[Address] = []
        for _, master in self.ranges:
            if master not in seen:
                seen.append(master)
        return seen


class Links:
    """One bus session's connections: ``publishing`` (one per Redis master) and
    ``subscribed`` (to the session's topics); ``all`` both (the session ends when one
    closes). ``route(topic)`` is the connection and the start of the publish command
    (``resp.publish_head`` / ``spublish_head``) for ``topic``, worked out once per topic
    by ``target`` and kept in ``routes`` (which a writer may read first);
    ``listener(topic)`` the subscribed connection that hears it.
    ``sharded``: on a Redis Cluster (SSUBSCRIBE and SUNSUBSCRIBE, one channel each)."""

    def __init__(self, target: Callable[[str], tuple[RespConnection, bytes]],
                 publishing: list[RespConnection], subscribed: list[RespConnection],
                 where: str, listener: Callable[[str], RespConnection] | None = None,
                 sharded: bool = False) -> None:
        self._target = target
        self.routes: dict[str, tuple[RespConnection, bytes]] = {}
        self.publishing = publishing
        self.subscribed = subscribed
        self.all = publishing + subscribed
        self.where = where  # for the log: the Redis, or the shards and who owns what
        self.listener = listener or (lambda topic: subscribed[0])
        self._sharded = sharded

    def route(self, topic: str) -> tuple[RespConnection, bytes]:
        known = self.routes.get(topic)
        if known is None:
            known = self.routes[topic] = self._target(topic)
        return known

    async def listen(self, topics: list[str], on: bool) -> None:
        """Subscribe to ``topics`` (``on``) or unsubscribe, once Redis has answered.
        Raises the connection's reason if one closes first (the session is over)."""
        if not topics:
            return
        if not self._sharded:  # one command for them all
            await self.subscribed[0].request(b"SUBSCRIBE" if on else b"UNSUBSCRIBE",
                                             *(t.encode() for t in topics),
                                             replies=len(topics))
            return
        asked = []
        for topic in topics:  # a sharded command's channels must share one slot
            conn = self.listener(topic)
            if not on:
                conn.unsubscribing += 1
            asked.append(conn.request(b"SSUBSCRIBE" if on else b"SUNSUBSCRIBE",
                                      topic.encode()))
        await asyncio.gather(*asked)

    def close(self) -> None:
        for conn in self.all:
            conn.abort(ConnectionError("bus session over"))


class Seeds:
    """The addresses a Redis Cluster is looked for at: the URL's seeds, then every node
    the last slot map named (a seed may be the master that was lost)."""

    def __init__(self, url: str) -> None:
        self.seeds, self.options, self.secure = parse_cluster_url(url)
        self.known: list[Address] = []

    def order(self) -> list[Address]:
        return self.seeds + [a for a in self.known if a not in self.seeds]


async def open_links(url: str, topics: list[str], on_message: Callable[[bytes, bytes], None],
                     tls_ca: str = "", seeds: Seeds | None = None,
                     timeout: float = 2.0, loopback_only: bool = False) -> Links:
    """The connections of a session on ``url``, subscribed to ``topics`` (see the module
    docstring). ``seeds``: kept by the caller between sessions (Redis Cluster). Raises
    OSError / ConnectionError (ClusterUnavailable, RedisReplyError, NotOnLoopback) /
    ValueError. ``loopback_only``: every Redis the session would use (the master a
    Sentinel names, every node of the slot map) must be on loopback, judged before
    connecting to it."""
    if not is_cluster(url):
        pub = sub = None
        try:
            pub = await resp.connect(url, tls_ca, timeout, loopback_only=loopback_only)
            sub = await resp.connect(url, tls_ca, timeout, on_message=on_message,
                                     loopback_only=loopback_only)
            await sub.request(b"SUBSCRIBE", *(t.encode() for t in topics), replies=len(topics))
            await pub.request(b"PING")
        except BaseException:
            for conn in (pub, sub):
                if conn is not None:
                    conn.abort(ConnectionError("connect failed"))
            raise
        return Links(lambda topic: (pub, resp.publish_head(topic)), [pub], [sub], url)
    return await _open_sharded(topics, on_message, tls_ca, seeds or Seeds(url), timeout,
                               loopback_only)


async def slot_map(seeds: Seeds, tls_ca: str = "", timeout: float = 2.0) -> SlotMap:
    """The slot map from the first of ``seeds.order()`` that answers ``CLUSTER SLOTS``."""
    failures = []
    for address in seeds.order():
        conn = None
        try:
            conn = await _connect(address, seeds, tls_ca, timeout)
            async with asyncio.timeout(timeout):
                reply = (await conn.request(b"CLUSTER", b"SLOTS"))[0]
        except (OSError, ConnectionError) as exc:  # TimeoutError is an OSError
            failures.append(f"{address[0]}:{address[1]}: {exc or type(exc).__name__}")
            continue
        finally:
            if conn is not None:
                conn.abort(ConnectionError("slot map read"))
        found = SlotMap.parse(reply, address)
        seeds.known = found.nodes
        return found
    raise ClusterUnavailable("no Redis Cluster node answered: " + "; ".join(failures))


async def _connect(address: Address, seeds: Seeds, tls_ca: str, timeout: float,
                   on_message: Callable[[bytes, bytes], None] | None = None
                   ) -> RespConnection:
    return await resp.connect_to({**seeds.options, "host": address[0], "port": address[1]},
                                 seeds.secure, tls_ca, timeout, on_message)


async def _open_sharded(topics: list[str], on_message: Callable[[bytes, bytes], None],
                        tls_ca: str, seeds: Seeds, timeout: float,
                        loopback_only: bool) -> Links:
    found = await slot_map(seeds, tls_ca, timeout)
    if loopback_only:
        try:
            require_loopback(found.nodes, "the Redis Cluster node")
        except NotOnLoopback:
            seeds.known = []  # nor asked for the next slot map
            raise
    pubs: dict[Address, RespConnection] = {}
    subs: dict[Address, RespConnection] = {}  # on every master: topics come and go
    try:
        for master in found.masters():
            pubs[master] = await _connect(master, seeds, tls_ca, timeout)
            subs[master] = await _connect(master, seeds, tls_ca, timeout, on_message)
        by_owner: dict[Address, list[str]] = {}
        for topic in topics:
            by_owner.setdefault(found.owner(topic), []).append(topic)
        for owner, mine in by_owner.items():
            # one SSUBSCRIBE per channel: a command's channels must share one slot
            for topic in mine:
                await subs[owner].request(b"SSUBSCRIBE", topic.encode())
        for pub in pubs.values():
            await pub.request(b"PING")
    except BaseException:
        for conn in [*pubs.values(), *subs.values()]:
            conn.abort(ConnectionError("connect failed"))
        raise
    where = ", ".join(f"{t} on {h}:{p}" for (h, p), ts in by_owner.items() for t in ts)
    return Links(lambda topic: (pubs[found.owner(topic)], resp.spublish_head(topic)),
                 list(pubs.values()), list(subs.values()),
                 f"Redis Cluster of {len(pubs)} masters ({where})",
                 lambda topic: subs[found.owner(topic)], sharded=True)
