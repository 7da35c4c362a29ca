"""The two ends of a WebSocket connection: a server's (it answers plain HTTP too) and a
client's, with ``dial`` to open one. Framing is ``transport.FrameIO``'s; the heads
are ``handshake.py``'s.

``ServerConnection`` reads the request; ``http_request(request)`` (the subclass)
answers it with ``(status, body, headers)`` — the connection then closes — or None
to upgrade it; ``upgraded()`` follows a 101. A bad request is answered with its
status (400, 405, 426, 431) and closed.

``dial(factory, url, ssl_context)`` connects a ``ClientConnection`` and runs the
handshake. Errors: ``OSError`` (no TCP connection), ``HandshakeRefused`` (an HTTP
status other than 101, with its body), ``HandshakeError`` (a bad answer, or the
connection closed during the handshake). Cancelled (the caller's timeout), it
aborts the connection.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import urllib.parse
from typing import Callable, TypeVar

from rpcbus.handshake import (
    ClientHandshake,
    HandshakeError,
    HandshakeRefused,
    HttpRequest,
    ServerHandshake,
    http_response,
)
from rpcbus.transport import CLOSE_GRACE, CONNECTING, FrameIO

log = logging.getLogger("rpcbus.websocket")

__all__ = ["ClientConnection", "HandshakeError", "HandshakeRefused", "HttpRequest",
           "ServerConnection", "dial"]

#: What a server answers a plain HTTP request with: status, body, extra headers.
HttpAnswer = tuple[int, bytes, dict[str, str]]


class ServerConnection(FrameIO):
    """A server's end: reads the request, answers HTTP or upgrades to WebSocket."""

    is_server = True
    max_head = 16 << 10  # bytes an HTTP request head may take

    def __init__(self) -> None:
        super().__init__()
        self._handshake: ServerHandshake | None = ServerHandshake(self.max_head)

    def handshake_data(self, data: bytes) -> None:
        hs = self._handshake
        if hs is None or self.transport.is_closing():
            return
        try:
            request = hs.receive(data)
            if request is None:
                return
            try:
                answer = self.http_request(request)
            except Exception:  # a bug answering HTTP costs this request, not the server
                log.exception("http_request_failed path=%s", request.path)
                answer = 500, b"internal error\n", {}
            if answer is not None:
                self._handshake = None
                self.answer_and_close(*answer)
                return
            accept = hs.accept(request)
        except HandshakeError as exc:
            self._handshake = None
            self.answer_and_close(exc.status, f"{exc}\n".encode())
            return
        self._handshake = None
        self.transport.write(accept)
        self.upgraded()
        self.opened(hs.rest)

    def answer_and_close(self, status: int, body: bytes,
                         headers: dict[str, str] | None = None) -> None:
        """Answer with an HTTP response and close (aborting after ``CLOSE_GRACE`` s if
        the peer does not read it)."""
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(http_response(status, body, headers))
        transport.close()
        self.loop.call_later(CLOSE_GRACE, transport.abort)

    def http_request(self, request: HttpRequest) -> HttpAnswer | None:
        """A request has arrived: an answer for plain HTTP, or None to upgrade it."""
        if not request.wants_websocket:
            return 426, b"this port speaks WebSocket\n", {}
        return None

    def upgraded(self) -> None:
        """The 101 has been written; frames follow. Default: nothing."""


class ClientConnection(FrameIO):
    """A client's end: ``dial`` runs its handshake."""

    def __init__(self) -> None:
        super().__init__()
        self._handshake: ClientHandshake | None = None
        self._answered: asyncio.Future[None] = self.loop.create_future()

    async def handshake(self, hs: ClientHandshake) -> None:
        self._handshake = hs
        self.transport.write(hs.request())
        await self._answered

    def handshake_data(self, data: bytes) -> None:
        hs = self._handshake
        if hs is None or self._answered.done():
            return
        try:
            rest = hs.receive(data)
        except HandshakeError as exc:
            self._answered.set_exception(exc)
            self.transport.close()
            return
        if rest is not None:
            self._handshake = None
            self._answered.set_result(None)
            self.opened(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is CONNECTING and self._handshake is not None \
                and not self._answered.done():
            try:
                self._handshake.receive(b"")  # a refusal's body may end at EOF
                error: HandshakeError = HandshakeError(
                    "the connection closed during the handshake")
            except HandshakeError as refused:
                error = refused
            self._answered.set_exception(error)
        super().connection_lost(exc)


C = TypeVar("C", bound=ClientConnection)


async def dial(factory: Callable[[], C], url: str,
               ssl_context: ssl.SSLContext | None = None) -> C:
    """Open a WebSocket connection to ``url`` (ws:// or wss://); see the module
    docstring for errors and cancellation."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a WebSocket URL (ws:// or wss://): {url}")
    secure = parts.scheme == "wss"
    host = parts.hostname
    port = parts.port or (443 if secure else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    tls = (ssl_context or ssl.create_default_context()) if secure else None
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(factory, host, port, ssl=tls,
                                           server_hostname=host if tls else None)
    try:
        await conn.handshake(ClientHandshake(parts.netloc.rpartition("@")[2], target))
    except BaseException:
        conn.transport.abort()
        raise
    return conn
