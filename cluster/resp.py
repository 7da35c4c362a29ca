"""A lean Redis connection for the bus's hot path: commands written as RESP by hand, one
``write()`` per round, replies and pub/sub pushes parsed by hiredis in ``data_received``.

Why not redis-py here: its asyncio pub/sub hands over one message per awaited
``get_message`` (a wake-up, a dict and several parser layers each), and a
pipeline of PUBLISH rounds costs a task, a lock and a command object per
PUBLISH. Measured on the cross-node benchmark, redis-py's reading and
pipelining took ~25 % of a node's CPU (docs/performance-archive.md). The parser is
the one redis-py itself uses (hiredis); redis-py still parses the URL, finds
the master through Sentinel, and serves everything off the hot path
(``rpcbus status``, tests).

``connect()`` opens one connection (TCP, TLS for ``rediss://``, a Unix socket
for ``unix://``; through Sentinel for ``redis+sentinel://``) and
authenticates; ``connect_to()`` opens one to a given address with a URL's
credentials and TLS (a Redis Cluster's shards, cluster/shards.py). On it,
``send(data, replies, done)`` writes pre-encoded commands and calls ``done()``
once that many replies have come back, in order (RESP pipelining);
``request()`` awaits one command's replies and returns them. A connection
given ``on_message`` treats ``["message", channel, data]`` and sharded
``["smessage", channel, data]`` replies as pushes (a subscribed connection);
on it an ``sunsubscribe`` nobody asked for (Redis Cluster moved the slot of a
sharded channel away; ``unsubscribing`` counts those asked for) closes the
connection with ``SlotMoved``. An error
reply (``MOVED`` too), a protocol error or an exception in ``on_message``
closes the connection: ``closed`` then holds the reason, and nothing more is
delivered. Cancelling ``connect()`` or ``request()`` leaves no connection open.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, Callable

import hiredis
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel

from rpcbus.cluster.redisconn import SENTINEL, parse_sentinel_url, require_loopback


class RedisReplyError(ConnectionError):
    """Redis answered a bus command with an error (an ACL refusal, a full memory, MOVED...)."""


class SlotMoved(ConnectionError):
    """Redis Cluster unsubscribed a sharded channel: its slot now lives elsewhere."""


def encode(*args: bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        out.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(out)


def publish_head(topic: str) -> bytes:
    """The start of a PUBLISH to ``topic``; ``publish(head, payload)`` completes it."""
    name = topic.encode()
    return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n" % (len(name), name)


def spublish_head(topic: str) -> bytes:
    """The start of a sharded PUBLISH (Redis Cluster: the shard owning the topic's slot)."""
    name = topic.encode()
    return b"*3\r\n$8\r\nSPUBLISH\r\n$%d\r\n%b\r\n" % (len(name), name)


def publish(head: bytes, payload: bytes) -> bytes:
    return b"%b$%d\r\n%b\r\n" % (head, len(payload), payload)


class RespConnection(asyncio.Protocol):
    """One connection; see the module docstring."""

    def __init__(self, on_message: Callable[[bytes, bytes], None] | None = None) -> None:
        self._reader = hiredis.Reader()
        self._on_message = on_message
        # [replies left, done(error | None), the replies' list (request()) or None]
        self._waiting: deque[list[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.paused = False  # the transport's buffer is over its high-water mark
        self.unsubscribing = 0  # SUNSUBSCRIBEs sent and not yet answered

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        on_message = self._on_message
        waiting = self._waiting
        try:
            while (reply := reader.gets()) is not False:
                if on_message is not None and type(reply) is list:
                    kind = reply[0]
                    if kind == b"message" or kind == b"smessage":
                        on_message(reply[1], reply[2])
                        continue
                    if kind == b"sunsubscribe":
                        if not self.unsubscribing:  # never asked for: the slot moved away
                            raise SlotMoved(f"Redis Cluster moved the slot of "
                                            f"{reply[1].decode(errors='replace')}")
                        self.unsubscribing -= 1  # the answer to our SUNSUBSCRIBE
                if isinstance(reply, hiredis.ReplyError):
                    raise RedisReplyError(f"Redis: {reply}")
                if not waiting:
                    raise ConnectionError(f"Redis sent a reply nobody asked for: {reply!r}")
                head = waiting[0]
                if head[2] is not None:
                    head[2].append(reply)
                head[0] -= 1
                if head[0] == 0:
                    waiting.popleft()
                    head[1](None)
        except Exception as exc:  # a bad reply or a bug: this connection is done for
            self.abort(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc or ConnectionError("Redis closed the connection"))

    def pause_writing(self) -> None:
        self.paused = True
        self._can_write.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self._can_write.set()

    # -- use ---------------------------------------------------------------------------

    def send(self, data: bytes, replies: int, done: Callable[[BaseException | None], None],
             into: list[Any] | None = None) -> None:
        """Write ``data`` (``replies`` commands); ``done(None)`` once all are answered,
        ``done(reason)`` if the connection closes first. ``into``: a list the replies are
        appended to."""
        if self.closed.done() or self.transport is None:
            done(self.closed.result() if self.closed.done() else ConnectionError("not open"))
            return
        self._waiting.append([replies, done, into])
        self.transport.write(data)

    async def request(self, *args: bytes, replies: int = 1) -> list[Any]:
        """Send one command, wait for its ``replies`` (a SUBSCRIBE to n channels: n) and
        return them. Raises the connection's reason if it closes first."""
        answered: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())

        def done(error: BaseException | None) -> None:
            if not answered.done():
                answered.set_result(error)

        got: list[Any] = []
        self.send(encode(*args), replies, done, got)
        error = await answered
        if error is not None:
            raise error
        return got

    async def writable(self) -> None:
        """Wait while the transport's buffer is over its high-water mark (``paused``: a
        writer that reads it first awaits only then)."""
        await self._can_write.wait()

    def abort(self, reason: BaseException) -> None:
        self._finish(reason)
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, reason: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(reason)
        self.paused = False
        self._can_write.set()
        waiting, self._waiting = self._waiting, deque()
        for _, done, _ in waiting:
            done(reason)


async def connect(url: str, tls_ca: str = "", timeout: float = 2.0,
                  on_message: Callable[[bytes, bytes], None] | None = None,
                  loopback_only: bool = False) -> RespConnection:
    """An open, authenticated connection to the Redis of ``url`` (or its master, through
    Sentinel). Raises OSError / ConnectionError / ValueError (a bad URL).
    ``loopback_only``: the master a Sentinel names must be on loopback (NotOnLoopback,
    before connecting to it; asked again at every connect, so after every failover)."""
    if url.startswith(SENTINEL):
        sentinels, master, options = parse_sentinel_url(url)
        finder = Sentinel(  # type: ignore[no-untyped-call]  # redis-py: not annotated
            sentinels, sentinel_kwargs={"socket_timeout": timeout,
                                        "socket_connect_timeout": timeout})
        try:
            host, port = await finder.discover_master(master)
        finally:
            for sentinel in finder.sentinels:
                await sentinel.aclose()
        if loopback_only:
            require_loopback([(host, port)], f"the master {master!r} the Sentinels name,")
        options.update(host=host, port=port)
        secure = False
    else:
        options = dict(parse_url(url))
        secure = url.startswith("rediss:")
    return await connect_to(options, secure, tls_ca, timeout, on_message)


async def connect_to(options: dict[str, Any], secure: bool = False, tls_ca: str = "",
                     timeout: float = 2.0,
                     on_message: Callable[[bytes, bytes], None] | None = None
                     ) -> RespConnection:
    """An open, authenticated connection to ``options``' address (redis-py's URL options:
    ``host`` and ``port`` or ``path``; ``username``, ``password``, ``ssl_cert_reqs``), over
    TLS if ``secure``. Raises OSError / ConnectionError (a refused login: RedisReplyError)."""
    loop = asyncio.get_running_loop()
    context = None
    if secure:
        context = ssl.create_default_context(cafile=tls_ca or None)
        if options.get("ssl_cert_reqs") in ("none", "optional"):
            context.check_hostname = False
            context.verify_mode = (ssl.CERT_NONE if options["ssl_cert_reqs"] == "none"
                                   else ssl.CERT_OPTIONAL)
    conn: RespConnection | None = None
    try:
        async with asyncio.timeout(timeout):
            if "path" in options:
                _, conn = await loop.create_unix_connection(
                    lambda: RespConnection(on_message), options["path"])
            else:
                _, conn = await loop.create_connection(
                    lambda: RespConnection(on_message), options.get("host", "localhost"),
                    options.get("port", 6379), ssl=context)
            password = options.get("password")
            if password:
                user = options.get("username")
                auth = (b"AUTH", user.encode(), password.encode()) if user else (
                    b"AUTH", password.encode())
                await conn.request(*auth)
    except BaseException:
        if conn is not None:
            conn.abort(ConnectionError("connect failed"))
        raise
    return conn
