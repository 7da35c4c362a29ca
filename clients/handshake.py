"""The WebSocket opening handshake (RFC 6455 section 4): HTTP/1.1 heads read by h11.

Pure: bytes in, bytes and decisions out. ``ClientHandshake`` builds the upgrade
request and checks the server's answer; ``ServerHandshake`` reads a request (an
upgrade, or a plain HTTP request such as ``GET /healthz``) and builds the 101
answer; ``http_response`` builds any other answer. h11 bounds what a head may
cost (``max_head`` bytes) and rejects malformed HTTP; the WebSocket rules (key,
version, accept hash) are here. Neither side negotiates extensions or
subprotocols: frames are never compressed.

Errors: ``HandshakeError`` (a malformed or unacceptable head; ``status`` is the
HTTP status a server answers it with) and its subclass ``HandshakeRefused`` (the
server answered with a status other than 101; ``status`` and ``body`` say what).
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from typing import Iterable

import h11

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_BODY = 64 << 10  # bytes of a refusal's body a client keeps

_REASONS = {200: b"OK", 302: b"Found", 400: b"Bad Request", 401: b"Unauthorized",
            404: b"Not Found", 405: b"Method Not Allowed", 426: b"Upgrade Required",
            429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
            500: b"Internal Server Error", 503: b"Service Unavailable"}


class HandshakeError(Exception):
    """The other side's head broke HTTP/1.1 or the WebSocket rules."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class HandshakeRefused(HandshakeError):
    """The server answered the upgrade request with ``status`` (not 101) and ``body``."""

    def __init__(self, status: int, body: bytes) -> None:
        text = body[:200].decode("utf-8", "replace").strip()
        super().__init__(f"server rejected WebSocket connection: HTTP {status}"
                         + (f" ({text})" if text else ""), status)
        self.body = body


def accept_key(key: bytes) -> bytes:
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1(key + GUID).digest())


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def _headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lowercased names to values; a repeated header's values joined with ", "."""
    out: dict[str, str] = {}
    for name, value in raw:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


@dataclass(frozen=True)
class HttpRequest:
    """A request head: ``path`` with its query; ``headers`` by lowercased name."""

    method: str
    path: str
    headers: dict[str, str]

    @property
    def wants_websocket(self) -> bool:
        return "websocket" in _tokens(self.headers.get("upgrade", ""))


class ClientHandshake:
    """A client's side: send ``request()``, then feed what the server sends to
    ``receive`` until it returns the bytes that followed the 101."""

    def __init__(self, host: str, target: str, max_head: int = 64 << 10) -> None:
        self.key = base64.b64encode(os.urandom(16))
        self._host, self._target = host, target
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head)
        self._status = 0
        self._body = bytearray()

    def request(self) -> bytes:
        head = self._conn.send(h11.Request(method="GET", target=self._target, headers=[
            ("Host", self._host), ("Upgrade", "websocket"), ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", self.key.decode()), ("Sec-WebSocket-Version", "13"),
            ("User-Agent", "rpcbus")]))
        return (head or b"") + (self._conn.send(h11.EndOfMessage()) or b"")

    def receive(self, data: bytes) -> bytes | None:
        """Bytes from the server (``b""`` at EOF). None while its answer is incomplete;
        once it switched to WebSocket, the bytes that followed its answer (frames).
        Raises ``HandshakeRefused`` for another status, ``HandshakeError`` for a bad
        answer or EOF before one."""
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise HandshakeError("the connection closed during the handshake")
                    return None
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code == 101:
                        self._check(_headers(event.headers))
                        return bytes(self._conn.trailing_data[0])
                elif isinstance(event, h11.Response):
                    self._status = event.status_code
                elif isinstance(event, h11.Data):
                    room = MAX_BODY - len(self._body)
                    if room > 0:
                        self._body += event.data[:room]
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    if self._status:
                        raise HandshakeRefused(self._status, bytes(self._body))
                    raise HandshakeError("the connection closed during the handshake")
                else:  # PAUSED without a 101
                    raise HandshakeError("an unexpected answer to the upgrade request")
        except h11.RemoteProtocolError as exc:
            raise HandshakeError(f"a malformed HTTP answer: {exc}") from None

    def _check(self, headers: dict[str, str]) -> None:
        if "websocket" not in _tokens(headers.get("upgrade", "")) or \
                "upgrade" not in _tokens(headers.get("connection", "")):
            raise HandshakeError("the 101 answer lacks Upgrade: websocket")
        if headers.get("sec-websocket-accept", "").encode("latin-1") != accept_key(self.key):
            raise HandshakeError("the 101 answer's Sec-WebSocket-Accept is wrong")
        if headers.get("sec-websocket-extensions") or headers.get("sec-websocket-protocol"):
            raise HandshakeError("the server chose an extension or subprotocol not offered")


class ServerHandshake:
    """A server's side: feed ``receive`` until it returns the request, then answer it
    with ``accept`` (101; the bytes that followed the request are then in ``rest``)
    or ``http_response`` (and close)."""

    def __init__(self, max_head: int = 16 << 10) -> None:
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self._request: HttpRequest | None = None
        self.rest = b""

    def receive(self, data: bytes) -> HttpRequest | None:
        """The request once its head is in (and its body, which must be empty), else
        None. Raises ``HandshakeError`` for bad HTTP (431 for a head over ``max_head``)
        or a request with a body."""
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    return None
                if isinstance(event, h11.Request):
                    self._request = HttpRequest(event.method.decode("ascii", "replace"),
                                                event.target.decode("latin-1"),
                                                _headers(event.headers))
                elif isinstance(event, h11.Data):
                    raise HandshakeError("a request with a body")
                elif isinstance(event, h11.EndOfMessage) or event is h11.PAUSED:
                    if self._request is None:
                        raise HandshakeError("no request")
                    return self._request
                else:  # ConnectionClosed
                    raise HandshakeError("the connection closed during the request")
        except h11.RemoteProtocolError as exc:
            raise HandshakeError(f"a malformed HTTP request: {exc}",
                                 exc.error_status_hint) from None

    def accept(self, request: HttpRequest) -> bytes:
        """The 101 answer to a valid upgrade request; ``HandshakeError`` (400, 405, 426)
        for one that breaks RFC 6455 4.2.1."""
        headers = request.headers
        if request.method != "GET":
            raise HandshakeError("a WebSocket upgrade must be a GET", 405)
        if "upgrade" not in _tokens(headers.get("connection", "")):
            raise HandshakeError("Connection: Upgrade is missing")
        if headers.get("sec-websocket-version", "") != "13":
            raise HandshakeError("Sec-WebSocket-Version must be 13", 426)
        key = headers.get("sec-websocket-key", "").strip().encode("latin-1")
        try:
            if len(base64.b64decode(key, validate=True)) != 16:
                raise ValueError
        except ValueError:
            raise HandshakeError("Sec-WebSocket-Key must be 16 bytes in base64") from None
        self.rest = bytes(self._conn.trailing_data[0])
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept_key(key)
                + b"\r\n\r\n")


def http_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response after which the server closes the connection."""
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Status")),
             b"Content-Length: %d" % len(body), b"Connection: close"]
    for name, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}.items():
        lines.append(f"{name}: {value}".encode("latin-1"))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
