"""The cluster bus over Redis pub/sub: one control topic, one private topic per node.

``publish(topic, msg)`` only queues. One writer task sends everything queued
per topic as one PUBLISH of one batch (cluster/messages.py), all topics of a
round in one pipeline; while a round is in flight the next one gathers, so
batches grow with load (per-message PUBLISH through redis-py stalls near 8k/s).
One reader task hands every received batch to ``on_batch``.

With a ``Sealer`` (cluster/seal.py) every batch is sealed on the way out; on
the way in, a batch that does not open (no or bad seal, unknown key id, clock
skew) or that repeats one already seen is dropped, counted by reason in
``stats`` and logged (at most one line per reason per ``WARN_EVERY`` seconds),
never acted on.

Faults: any Redis error, or ``stale()`` (the owner noticed its own heartbeats
stopped coming back: a paused or cut-off Redis), ends the session; the bus
reports ``on_down``, drops what it had queued (counted in ``dropped``), waits
with ``Backoff`` and connects again, then reports ``on_up`` so the owner can
announce itself again. Cancelling ``run()`` stops the bus and closes its
connections.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import structlog
from redis.exceptions import RedisError

from clients.backoff import Backoff

from . import redisconn
from .messages import BadBatch, decode_batch, encode_batch
from .seal import ReplayGuard, Sealer, SealError

log = structlog.get_logger(module="rpcbus.bus")

#: PUBLISH rounds written at once, each on its own pooled connection: a new round
#: need not wait for the previous one's replies (order across rounds is not kept;
#: nothing in the protocol depends on it within a round trip).
ROUNDS_IN_FLIGHT = 4
WARN_EVERY = 10.0


class Bus:
    def __init__(self, url: str, namespace: str, me: str,
                 on_batch: Callable[[str, float, list[list[Any]]], None],
                 on_up: Callable[[], None], on_down: Callable[[str], None],
                 backoff: Backoff | None = None, sealer: Sealer | None = None,
                 max_skew: float = 30.0, tls_ca: str = "") -> None:
        self.url = url
        self.me = me
        self.control = f"{namespace}:ctrl"
        self.private = self.topic_of(me, namespace)
        self.namespace = namespace
        self.up = False
        self.stats = {"batches_out": 0, "messages_out": 0, "batches_in": 0,
                      "messages_in": 0, "bad_batches": 0, "bad_messages": 0, "dropped": 0,
                      "reconnects": 0, "rejected": 0}
        self.rejected: dict[str, int] = {}  # by reason: unsealed, bad_seal, unknown_key, ...
        self._sealer = sealer
        # rediss://: verify Redis' certificate against this CA file (else the system's)
        self._redis_opts = {"ssl_ca_certs": tls_ca} if tls_ca and url.startswith("rediss:") else {}
        self._replays = ReplayGuard(max_skew)
        self._warned_at: dict[str, float] = {}
        self._on_batch, self._on_up, self._on_down = on_batch, on_up, on_down
        self._backoff = backoff or Backoff()
        self._out: dict[str, list[list[Any]]] = {}
        self._then: list[Callable[[], None]] = []  # run after this round is in Redis
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is queued or being written
        self._idle.set()
        self._session: asyncio.Task[None] | None = None

    @staticmethod
    def topic_of(node: str, namespace: str) -> str:
        return f"{namespace}:node:{node}"

    def publish(self, topic: str, msg: list[Any],
                then: Callable[[], None] | None = None) -> None:
        """Queue ``msg`` for ``topic``; it leaves with this tick's batch. Dropped while down.

        ``then`` runs once Redis has taken the batch (never, if the round fails).
        """
        if not self.up:
            self.stats["dropped"] += 1
            return
        if then is not None:
            self._then.append(then)
        box = self._out.get(topic)
        if box is None:
            self._out[topic] = [msg]
            self._wake.set()
            self._idle.clear()
        else:
            box.append(msg)

    async def flushed(self, timeout: float) -> bool:
        """Wait until everything queued has been written (False after ``timeout`` or if down)."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return self.up

    def stale(self, why: str) -> None:
        """The owner sees the bus is not delivering: drop this session and reconnect."""
        if self._session is not None and self.up:
            log.warning("bus_stale", reason=why)
            self._session.cancel()

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, for ever (until cancelled)."""
        while True:
            self._session = asyncio.create_task(self._serve_once())
            try:
                await self._session
                reason = "closed"
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # run() itself was cancelled
                    self._session.cancel()
                    raise
                reason = "stale"
            except (RedisError, OSError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if self.up:
                self.up = False
                self.stats["dropped"] += sum(len(v) for v in self._out.values())
                self._out.clear()
                self._then.clear()
                self._idle.set()
                self._on_down(reason)
            delay = self._backoff.next()
            log.warning("bus_down", reason=reason, retry_in_s=round(delay, 3))
            self.stats["reconnects"] += 1
            await asyncio.sleep(delay)

    async def _serve_once(self) -> None:
        pub = redisconn.client(self.url, socket_timeout=2.0, socket_connect_timeout=2.0,
                               **self._redis_opts)
        sub = redisconn.client(self.url, socket_connect_timeout=2.0, **self._redis_opts)
        pubsub = sub.pubsub()
        reader: asyncio.Task[None] | None = None
        writer: asyncio.Task[None] | None = None
        try:
            await pubsub.subscribe(self.control, self.private)
            await pub.ping()
            reader = asyncio.create_task(self._read(pubsub))
            self.up = True
            self._backoff.reset()
            log.info("bus_up", url=_safe(self.url), control=self.control, private=self.private)
            self._on_up()
            writer = asyncio.create_task(self._write(pub))
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raise what ended it
        finally:
            for task in (reader, writer):  # a session ended by stale() leaves both running
                if task is not None:
                    task.cancel()
                    task.add_done_callback(_retrieve)
            for closer in (pubsub.aclose(), pub.aclose(), sub.aclose()):
                try:
                    async with asyncio.timeout(1.0):
                        await closer
                except (Exception, asyncio.CancelledError):  # closing a dead link can fail any way
                    pass

    async def _write(self, pub: Any) -> None:
        slots = asyncio.Semaphore(ROUNDS_IN_FLIGHT)
        rounds: set[asyncio.Task[None]] = set()
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def send(out: dict[str, list[list[Any]]], then: list[Callable[[], None]]) -> None:
            try:
                sent_at = time.monotonic()
                sealer = self._sealer
                async with pub.pipeline(transaction=False) as pipe:
                    for topic, msgs in out.items():
                        batch = encode_batch(self.me, sent_at, msgs)
                        pipe.publish(topic, batch if sealer is None else sealer.seal(topic, batch))
                        self.stats["batches_out"] += 1
                        self.stats["messages_out"] += len(msgs)
                    await pipe.execute()
                for callback in then:
                    callback()
            except Exception as exc:  # ends the session: the bus reconnects
                if not failed.done():
                    failed.set_exception(exc)
            finally:
                slots.release()
                if not self._out and len(rounds) <= 1:
                    self._idle.set()

        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await slots.acquire()
                if failed.done():
                    failed.result()
                out, self._out = self._out, {}
                then, self._then = self._then, []
                if not out:
                    slots.release()
                    continue
                task = asyncio.create_task(send(out, then))
                rounds.add(task)
                task.add_done_callback(rounds.discard)
        finally:
            for task in rounds:
                task.cancel()

    async def _read(self, pubsub: Any) -> None:
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            if msg is None or msg.get("type") != "message":
                continue
            data, seq = msg["data"], 0
            if self._sealer is not None:
                try:
                    data, seq = self._sealer.open(msg["channel"].decode(), data)
                except SealError as exc:
                    self._reject(str(exc))
                    continue
            try:
                sender, sent_at, msgs, bad = decode_batch(data)
            except BadBatch:
                self.stats["bad_batches"] += 1
                continue
            if self._sealer is not None and not self._replays.fresh(sender, seq,
                                                                     time.monotonic()):
                self._reject("replay")
                continue
            self.stats["bad_messages"] += bad
            self.stats["batches_in"] += 1
            self.stats["messages_in"] += len(msgs)
            self._on_batch(sender, sent_at, msgs)


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
