"""The cluster bus over Redis pub/sub: one control topic, one private topic per node,
and the event channels this node's subscribers need.

``publish(topic, msg)`` only queues. One writer task sends everything queued
per topic as one PUBLISH of one batch (cluster/messages.py), all topics of a
round in one ``write()`` per Redis; while a round is at Redis the next one
gathers, so batches grow with load (per-message PUBLISH through redis-py stalls
near 8k/s). The subscribed connection hands every batch it reads to
``on_batch`` at once. The connections are cluster/resp.py's lean RESP
connections (hiredis), opened by cluster/shards.py: on one Redis a publishing
and a subscribed one; on a Redis Cluster sharded pub/sub (SPUBLISH to the master
owning a topic's slot, SSUBSCRIBE there), one ``write()`` per master in a round.

With a ``Sealer`` (cluster/seal.py) every batch is sealed on the way out; on
the way in, a batch that does not open (no or bad seal, unknown key id, clock
skew) or that repeats one already seen is dropped, counted by reason in
``stats`` and logged (at most one line per reason per ``WARN_EVERY`` seconds),
never acted on. What opening the batches that fail may cost is budgeted per
channel (``FAILED_OPENS_SHARE``): a Redis user publishing junk on a node's topic
gets the large batches of that topic dropped unopened while it lasts, not the
node's loop.

Addressing: every batch carries this process's incarnation and, on a private
topic, the incarnation of the node it is for (``publish(..., to=)``). A topic's
queue holds messages for one incarnation: queueing for a newer one drops what
waited for the older (that process is gone), and a message for an older one is
dropped (counted in ``dropped``).

Event channels (broker/events.py): ``listen(channel, on)`` adds one to the
topics heard or takes it out, on Redis at once while a session serves (one
SUBSCRIBE or UNSUBSCRIBE for what changed meanwhile) and at each new session's
start; ``listening[channel]`` is true once Redis has confirmed it in this
session, and ``on_listening()`` is called then (the node answers the
subscriptions that waited for it).

Faults: any error in a session — Redis, the network, a Redis Cluster slot
that moved or a shard master lost, or anything else (a bug, a message msgpack
cannot pack) — or ``stale()`` (the owner noticed its own
heartbeats stopped coming back: a paused or cut-off Redis) ends the session;
the bus reports ``on_down``, drops what it had queued (counted in ``dropped``),
waits with ``Backoff`` and connects again, then reports ``on_up`` so the owner
can announce itself again. A message published with ``hold_until`` (an answer
to another node's call) is kept while the bus is down and sent after the
reconnect if that time has not passed (cluster/outbox.py: at most ``MAX_HELD``; more are dropped
and counted). A message msgpack cannot pack, or larger than ``MAX_BATCH``
alone, is dropped alone (counted in ``unencodable``, logged, handed to
``on_unencodable`` so its sender hears why), never the round; a batch read larger
than that is refused before any crypto (``rejected["too_large"]``). Cancelling
``run()`` stops the bus and closes its connections.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from functools import partial
from typing import Any, Callable

import structlog
from redis.exceptions import RedisError

from rpcbus.backoff import Backoff
from rpcbus.cluster import resp
from rpcbus.cluster.budget import CheckBudget
from rpcbus.cluster.messages import (
    BadBatch,
    Batch,
    control_topic,
    decode_batch,
    encode_batch,
    node_topic,
)
from rpcbus.cluster.outbox import Outbox, Round
from rpcbus.cluster.redisconn import is_cluster
from rpcbus.cluster.resp import RespConnection
from rpcbus.cluster.seal import ReplayGuard, Sealer, SealError, SkewError
from rpcbus.cluster.shards import Links, Seeds, open_links

log = structlog.get_logger(module="rpcbus.bus")

#: PUBLISH rounds sent and not yet answered. One: while a round is at Redis the next
#: gathers, so under load batches grow by themselves, with no timer (on redis-py's
#: pipelines the 4-node spread benchmark cost 67 µs per call at 4 rounds, 54 µs at 1;
#: docs/performance-archive.md).
ROUNDS_IN_FLIGHT = 1
ROUND_TIMEOUT = 2.0  # a PUBLISH round Redis has not answered by then ends the session
#: the largest batch one PUBLISH carries: a round's messages for a topic are split to fit,
#: a message that alone does not fit is left out (``on_unencodable``), and a batch read
#: larger than this (and its seal) is refused unread, before any crypto. Redis drops a
#: subscriber whose unread pub/sub output passes 32 MB, or 8 MB for 60 s, by default
#: (``client-output-buffer-limit pubsub``, docs/operations.md).
MAX_BATCH = 4 << 20
SEAL_ROOM = 1024     # a sealed batch's envelope: header, nonce, tags
#: the CPU opening batches that do not open may take (they are forged: only a Redis user
#: can publish them), of one core, half of it for one channel; past it a channel's
#: batches larger than ``ALWAYS_OPENED`` are dropped unopened (``rejected["over_budget"]``)
#: while the small ones (heartbeats, most answers) are still opened
FAILED_OPENS_SHARE = 0.05
FAILED_OPENS_BURST = 0.05
ALWAYS_OPENED = 16 << 10
WARN_EVERY = 10.0


class Bus:
    def __init__(self, url: str, namespace: str, me: str, incarnation: int,
                 on_batch: Callable[[Batch, float], None],
                 on_up: Callable[[], None], on_down: Callable[[str], None],
                 backoff: Backoff | None = None, sealer: Sealer | None = None,
                 max_skew: float = 30.0, tls_ca: str = "",
                 on_skew: Callable[[str, float], None] | None = None,
                 on_unencodable: Callable[[str, int, list[Any], str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 loopback_only: bool = False) -> None:
        self.url = url
        self._loopback_only = loopback_only  # unsealed because Redis is on loopback
        self.me = me
        self.incarnation = incarnation
        self.control = control_topic(namespace)
        self.private = self.topic_of(me, namespace)
        self.namespace = namespace
        self.stats = {"batches_out": 0, "messages_out": 0, "batches_in": 0,
                      "messages_in": 0, "bad_batches": 0, "bad_messages": 0,
                      "reconnects": 0, "rejected": 0, "unencodable": 0}
        self.rejected: dict[str, int] = {}  # by reason: unsealed, bad_seal, unknown_key, ...
        self._sealer = sealer
        self._tls_ca = tls_ca  # rediss://: verify Redis' certificate against it (else the system's)
        self._replays = ReplayGuard(max_skew)
        self._opens = CheckBudget(FAILED_OPENS_SHARE, FAILED_OPENS_BURST)  # by channel
        self._warned_at: dict[str, float] = {}
        # (batch, now on ``clock``); the owner may set it after building the bus
        self.on_batch = on_batch
        self._clock = clock
        self._on_up, self._on_down = on_up, on_down
        self._on_skew = on_skew      # (sender, its clock minus ours in s): a batch refused
        self._on_unencodable = on_unencodable  # (topic, to, msg, why): left out of its batch
        self._backoff = backoff or Backoff()
        # what is queued, round by round (dropped/held counts are the outbox's stats)
        self.outbox = Outbox(time.monotonic, self._queued)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is queued or being written
        self._idle.set()
        self._session: asyncio.Task[None] | None = None
        # a session came up and its end is not yet dealt with (the outbox stops sending
        # on its own as soon as a round fails: ``up`` may be False before that)
        self._serving = False
        self._seeds = Seeds(url) if is_cluster(url) else None  # kept between sessions
        # event channels wanted -> Redis confirmed them in this session
        self.listening: dict[str, bool] = {}
        self.on_listening: Callable[[], None] = lambda: None
        self._relisten = asyncio.Event()  # ``listening`` changed since the last look

    topic_of = staticmethod(node_topic)

    @property
    def up(self) -> bool:
        """A session is serving (what it queues goes out; the outbox's own flag)."""
        return self.outbox.up

    def _queued(self) -> None:
        self._wake.set()
        self._idle.clear()

    @property
    def idle(self) -> bool:
        """Nothing is queued or being written (or the bus is down: nothing will be)."""
        return self._idle.is_set()

    def listen(self, channel: str, on: bool) -> None:
        """Hear ``channel`` from now on (``on``), or no longer (see the module docstring)."""
        if on:
            self.listening.setdefault(channel, False)
        else:
            self.listening.pop(channel, None)
        self._relisten.set()

    def stale(self, why: str) -> None:
        """The owner sees the bus is not delivering: drop this session and reconnect."""
        if self._session is not None and self._serving:
            log.warning("bus_stale", reason=why)
            self._session.cancel()

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, for ever. Cancelling it ends the session
        and waits (at most 5 s) for its Redis links to close."""
        while True:
            self._session = asyncio.create_task(self._serve_once())
            try:
                await self._session
                reason = "closed"
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # run() itself was cancelled
                    self._session.cancel()  # and it closes its Redis links (at most ~3 s)
                    await asyncio.wait((self._session,), timeout=5.0)
                    raise
                reason = "stale"
            except (RedisError, OSError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug must cost a reconnect, never the bus
                log.exception("bus_session_failed")
                reason = f"{type(exc).__name__}: {exc}"
            for channel in self.listening:
                self.listening[channel] = False
            if self._serving:
                self._serving = False
                self.outbox.went_down()
                self._idle.set()
                self._on_down(reason)
            delay = self._backoff.next()
            log.warning("bus_down", reason=reason, retry_in_s=round(delay, 3))
            self.stats["reconnects"] += 1
            await asyncio.sleep(delay)

    async def _serve_once(self) -> None:
        links: Links | None = None
        writer: asyncio.Task[None] | None = None
        listener: asyncio.Task[None] | None = None
        try:
            self._relisten.clear()
            heard = set(self.listening)
            links = await open_links(self.url, [self.control, self.private, *heard],
                                     self._deliver, self._tls_ca, self._seeds,
                                     loopback_only=self._loopback_only)
            for channel in heard & set(self.listening):
                self.listening[channel] = True
            self._relisten.set()  # what changed while it opened
            self.outbox.up = True
            self._serving = True
            self._backoff.reset()
            log.info("bus_up", url=_safe(self.url), control=self.control, private=self.private,
                     where=_safe(links.where))
            self._on_up()
            self.on_listening()  # the event channels heard from the start are confirmed
            self.outbox.came_up()
            writer = asyncio.create_task(self._write(links))
            listener = asyncio.create_task(self._keep_listening(links, heard))
            ends: list[asyncio.Future[Any]] = [writer, listener,
                                               *(c.closed for c in links.all)]
            done, _ = await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            for ended in done:
                reason = ended.result()  # the writer raises; a connection says why it closed
                if isinstance(reason, BaseException):
                    raise reason
        finally:
            for task in (writer, listener):  # a session ended by stale() leaves them running
                if task is not None:
                    task.cancel()
                    task.add_done_callback(_retrieve)
            if links is not None:
                links.close()

    async def _keep_listening(self, links: Links, heard: set[str]) -> None:
        """Subscribe to the event channels wanted and not ``heard`` yet in this session,
        unsubscribe from those heard and no longer wanted, whenever ``listening`` changes.
        Raises (ending the session) when Redis refuses or a connection closes."""
        while True:
            await self._relisten.wait()
            self._relisten.clear()
            wanted = set(self.listening)
            gone, new = sorted(heard - wanted), sorted(wanted - heard)
            await links.listen(gone, False)
            heard.difference_update(gone)
            await links.listen(new, True)
            heard.update(new)
            confirmed = [c for c in new if c in self.listening]
            for channel in confirmed:
                self.listening[channel] = True
            if confirmed:
                self.on_listening()

    async def _write(self, links: Links) -> None:
        """Send what is queued, one PUBLISH per topic, all topics of a round in one
        ``write()`` per Redis (per shard master on a Redis Cluster); at most
        ``ROUNDS_IN_FLIGHT`` rounds unanswered (while they are at Redis the next round
        gathers: batches grow with load, with no timer). A round Redis does not answer
        within ``ROUND_TIMEOUT`` ends the session; a round is answered once every Redis it
        went to answered."""
        rounds: deque[Round] = deque()  # rounds not yet answered
        routes, route = links.routes, links.route
        free = asyncio.Event()  # set while fewer than ROUNDS_IN_FLIGHT rounds are out
        free.set()

        def answered(error: BaseException | None, heard: list[tuple[list[str], list[Any]]]
                     ) -> None:
            taken = rounds.popleft()  # Redis answers in order
            if error is not None:  # the session is ending: keep its answers for the next
                self.outbox.failed(taken)
                return
            unheard: set[str] = set()
            if taken.holds:  # answers on a private topic nobody heard wait for its node
                for topics, replies in heard:
                    unheard.update(t for t, n in zip(topics, replies, strict=True) if n == 0)
                unheard.discard(self.control)
            more = self.outbox.answered(taken, unheard)
            free.set()
            if not rounds and not more:
                self._idle.set()

        def each_answered(left: list[Any], error: BaseException | None) -> None:
            """One Redis of a round answered: the round is once all it went to have (or
            at the first error). ``left``: [Redises yet to answer, [(topics of each
            PUBLISH, their replies: subscribers reached), ...]]."""
            if left[0] == 0:  # already concluded (an error)
                return
            left[0] = 0 if error is not None else left[0] - 1
            if left[0] == 0:
                answered(error, left[1])

        while True:
            await self._wake.wait()
            if len(rounds) >= ROUNDS_IN_FLIGHT:
                free.clear()
                try:
                    async with asyncio.timeout(ROUND_TIMEOUT):
                        await free.wait()
                except TimeoutError:
                    raise TimeoutError(f"Redis did not answer a PUBLISH round in "
                                       f"{ROUND_TIMEOUT:g} s") from None
            for conn in links.publishing:
                if conn.paused:
                    await conn.writable()
            self._wake.clear()
            taken = self.outbox.take_round()
            out, to = taken.out, taken.to
            sent_at = time.monotonic()
            sealer = self._sealer
            parts: dict[RespConnection, list[bytes]] = {}
            # each PUBLISH's topic, in order, when the round holds answers (``answered``
            # reads their replies: whether anyone heard them)
            topics: dict[RespConnection, list[str]] | None = {} if taken.holds else None
            for topic, msgs in out.items():
                batches = self._encode(topic, to[topic], sent_at, msgs)
                if not batches:
                    continue
                conn, head = routes.get(topic) or route(topic)
                mine = parts.get(conn)
                if mine is None:
                    mine = parts[conn] = []
                for batch in batches:
                    mine.append(resp.publish(head, batch if sealer is None
                                             else sealer.seal(topic, batch)))
                if topics is not None:
                    topics.setdefault(conn, []).extend([topic] * len(batches))
                self.stats["messages_out"] += len(msgs)
            if not parts:  # nothing (or nothing encodable) to send
                if not self.outbox.answered(taken) and not rounds:
                    self._idle.set()
                continue
            rounds.append(taken)
            heard: list[tuple[list[str], list[Any]]] = []
            left = [len(parts), heard]
            for conn, mine in parts.items():
                self.stats["batches_out"] += len(mine)
                replies: list[Any] | None = None
                if topics is not None:
                    replies = []
                    heard.append((topics[conn], replies))
                conn.send(b"".join(mine), len(mine), partial(each_answered, left), replies)

    def _deliver(self, channel: bytes, data: bytes) -> None:
        """One batch from a subscribed topic (called as the connection reads it)."""
        if len(data) > MAX_BATCH + SEAL_ROOM:  # no node sends one: not worth opening
            self._reject("too_large")
            return
        seq = 0
        if self._sealer is not None:
            topic = channel.decode()
            if len(data) > ALWAYS_OPENED and not self._opens.allows(topic, time.monotonic()):
                self._reject("over_budget")  # forged batches there spent its budget
                return
            started = time.perf_counter()
            try:
                data, seq = self._sealer.open(topic, data)
            except SkewError as exc:
                self._reject("skew")
                self._skewed(exc)
                return
            except SealError as exc:
                self._opens.spend(topic, time.perf_counter() - started, time.monotonic())
                self._reject(str(exc))
                return
        try:
            batch = decode_batch(data)
        except BadBatch:
            self.stats["bad_batches"] += 1
            return
        if self._sealer is not None and not self._replays.fresh(
                (batch.sender, batch.incarnation), seq, time.monotonic()):
            self._reject("replay")
            return
        self.stats["bad_messages"] += batch.malformed
        self.stats["batches_in"] += 1
        self.stats["messages_in"] += len(batch.messages)
        self.on_batch(batch, self._clock())

    def _skewed(self, exc: SkewError) -> None:
        """A genuine batch refused for its stamp: tell the owner whose clock is off."""
        if self._on_skew is None:
            return
        try:
            sender = decode_batch(exc.batch).sender
        except BadBatch:
            return
        self._on_skew(sender, exc.offset_s)

    def _encode(self, topic: str, to: int, sent_at: float,
                msgs: list[list[Any]]) -> list[bytes]:
        """The batches of one topic's round, each at most ``MAX_BATCH`` bytes (usually
        one); a message msgpack cannot pack in it (data nested deeper than the packer's
        1,024 levels less the batch's 3, an unknown type) or too large to travel alone is
        left out alone, counted, logged and handed to ``on_unencodable``: it must never
        cost the round or the bus."""
        try:
            batch = encode_batch(self.me, self.incarnation, to, sent_at, msgs)
        except (ValueError, TypeError, OverflowError):
            pass
        else:
            if len(batch) <= MAX_BATCH:
                return [batch]
            if len(msgs) > 1:  # halves, each split again as it needs
                half = len(msgs) // 2
                return (self._encode(topic, to, sent_at, msgs[:half])
                        + self._encode(topic, to, sent_at, msgs[half:]))
            self._left_out(topic, to, msgs[0], f"too large to cross the cluster bus "
                           f"({len(batch):,} bytes packed; {MAX_BATCH:,} at most)")
            return []
        good = []
        for msg in msgs:
            try:  # at the depth it has in the batch
                encode_batch(self.me, self.incarnation, to, sent_at, [msg])
            except (ValueError, TypeError, OverflowError) as exc:
                self._left_out(topic, to, msg, "nested too deeply to cross the cluster bus "
                               "(at most 1,021 levels)", str(exc))
            else:
                good.append(msg)
        return self._encode(topic, to, sent_at, good) if good else []

    def _left_out(self, topic: str, to: int, msg: list[Any], why: str,
                  error: str = "") -> None:
        self.stats["unencodable"] += 1
        log.error("bus_message_unencodable", kind=msg[0], error=error or why)
        if self._on_unencodable is not None:
            self._on_unencodable(topic, to, msg, why)

    def _reject(self, reason: str) -> None:
        self.stats["rejected"] += 1
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._warned_at.get(reason, -WARN_EVERY) >= WARN_EVERY:
            self._warned_at[reason] = now
            log.warning("bus_batch_rejected", reason=reason, total=self.rejected[reason])


def _retrieve(task: asyncio.Task[None]) -> None:
    """Consume the ending exception of a task of a session already over (it is known)."""
    if not task.cancelled():
        task.exception()


def _safe(url: str) -> str:
    """The URL without a password, for logs."""
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
