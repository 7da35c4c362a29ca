"""WebSocket connections over ``asyncio.Protocol``: frames in as they arrive, messages
out coalesced per loop tick. The I/O half of a node's sessions and of the SDK's wires.

The WebSocket layer (RFC 6455) is ours, over the event loop's transport: per-message
cost decides a broker's speed, and the SDK must install beside whatever websockets
release a user's other libraries pin. The opening handshake is HTTP/1.1 read by h11
(``handshake.py``); a subclass runs it in ``handshake_data`` and calls ``opened``.

Reading: ``data_received`` parses every complete frame it is given. A final binary
frame, masked as the side requires, outside a fragmented message, is the fast path:
its payload goes to ``frame_received`` (no Task, queue or future). Everything else
goes through ``_frame``: fragments are joined (at most ``max_size`` bytes in all), a
text message goes to ``text_received``, a ping or pong is first offered to
``control_received`` (the node prices them) and a ping answered, a close answered
and the connection closed. A broken frame (reserved bits, masked the wrong way, a
long or fragmented control frame, an unknown opcode, a stray continuation, a close
code that may not be sent, a 64-bit length with its top bit set) fails the
connection with 1002, a text message or close reason that is not UTF-8 with 1007
(a fragmented text message at its first bad byte), a message over ``max_size`` with
1009, at once: nothing after it is read. A partial frame waits in a buffer bounded by
``max_size``. tests/inproc/test_rfc6455.py holds both ends to RFC 6455 case by case.

Writes: ``send(msg)`` appends to an outbox; the first message of a tick schedules
one ``flush`` with ``call_soon``, which encodes the whole outbox as one frame (split
only where it would exceed ``max_out_frame``; one message over that goes to
``oversized``) and writes it with one ``transport.write``. A peer that stops reading
makes its transport buffer grow; past ``max_write_buffer`` bytes the connection is
closed (``on_slow_consumer``) rather than growing memory without bound. Messages
sent after the connection closed are dropped and counted in ``dropped_out``.

Keepalive (``start_keepalive``): after ``interval`` seconds in which nothing
arrived, a ping; nothing within ``timeout`` more fails the connection (1011).
Closing: ``close()`` sends a close frame and waits up to ``close_timeout`` for the
peer's close, then aborts; cancelling it leaves the connection closing.
``fail_now`` closes at once, giving buffered bytes ``CLOSE_GRACE`` seconds.

Client frames are masked (RFC 6455 5.3) with websockets' C helper when websockets
happens to be installed (the node's extra brings it; checked at import), else in
Python (~0.7 µs a small frame, ~1.9 ms a MiB, against 0.17 µs and 39 µs).
"""

from __future__ import annotations

import asyncio
import codecs
import enum
import os
from typing import Any, Callable

import msgpack

from rpcbus.protocol import MAX_FRAME_MESSAGES, SENT, encode

_packb = msgpack.packb
_from_bytes = int.from_bytes

CLOSE_GRACE = 1.0   # s a failed connection's buffered bytes get before it is aborted

#: One binary WebSocket message as the read path hands it over (no copy made).
FrameData = bytes | bytearray | memoryview


def _apply_mask_py(data: FrameData, mask: bytes | bytearray) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated (RFC 6455 5.3), in Python."""
    n = len(data)
    q, r = divmod(n, 4)
    return (_from_bytes(data, "little") ^ _from_bytes(mask * q + mask[:r], "little")
            ).to_bytes(n, "little")


def _fast_mask() -> Callable[[FrameData, bytes | bytearray], bytes]:
    """websockets' C masking helper when it is installed and answers as expected."""
    try:
        from websockets.speedups import apply_mask as c_mask
        if c_mask(b"\x00\x01\x02\x03\x04", b"abcd") == _apply_mask_py(
                b"\x00\x01\x02\x03\x04", b"abcd"):
            return c_mask
    except Exception:  # absent, or a release where it changed: ours is always right
        pass
    return _apply_mask_py


apply_mask = _fast_mask()


class State(enum.IntEnum):
    CONNECTING = 0
    OPEN = 1
    CLOSING = 2
    CLOSED = 3


CONNECTING, OPEN, CLOSING, CLOSED = State.CONNECTING, State.OPEN, State.CLOSING, State.CLOSED


class CloseCode(enum.IntEnum):
    """WebSocket close codes (RFC 6455 7.4.1)."""

    NORMAL_CLOSURE = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    NO_STATUS_RCVD = 1005
    INVALID_DATA = 1007
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


def valid_close_code(code: int) -> bool:
    """A code a close frame may carry (RFC 6455 7.4, and the IANA registry's 1012-1014):
    1000-1003, 1007-1014, and 3000-4999 for libraries and applications; 1004-1006 and
    1015 name states, not reasons, and may never be sent."""
    return 1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def ws_header(length: int, mask_bit: int) -> bytes:
    """The header of a final binary WebSocket frame of ``length`` bytes (RFC 6455 5.2)."""
    if length < 126:
        return bytes((0x82, mask_bit | length))
    if length < 0x10000:
        return bytes((0x82, mask_bit | 126)) + length.to_bytes(2, "big")
    return bytes((0x82, mask_bit | 127)) + length.to_bytes(8, "big")


def pack_in_frames(parts: list[bytes], max_frame: int,
                   max_messages: int = MAX_FRAME_MESSAGES, head: bytes = b"") -> list[bytes]:
    """Group already-packed messages into frames of at most ``max_frame`` bytes and
    ``max_messages`` messages; ``head``, when given, begins every frame (a SENT: the
    node times the calls of each frame from its own).

    A frame of one message is that message; several make a msgpack array. A
    single message larger than ``max_frame`` still goes out alone (with ``head``).
    """
    if head and max_messages < 2:   # no room for it beside a message: once, as one
        parts, head = [head, *parts], b""
    frames: list[bytes] = []
    first = [head] if head else []
    group = first.copy()
    size = len(head)
    for part in parts:
        if len(group) > len(first) and (size + len(part) + 5 > max_frame
                                         or len(group) >= max_messages):
            frames.append(_joined(group))
            group, size = first.copy(), len(head)
        group.append(part)
        size += len(part)
    if len(group) > len(first):
        frames.append(_joined(group))
    return frames


def _joined(group: list[bytes]) -> bytes:
    """One frame of packed messages: the message itself, or a msgpack array of them."""
    return group[0] if len(group) == 1 else _array_header(len(group)) + b"".join(group)


def frame(opcode: int, payload: bytes, masked: bool) -> bytes:
    """One final frame of ``opcode`` (a control frame, or any other), masked or not."""
    n = len(payload)
    bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((0x80 | opcode, bit | n))
    elif n < 0x10000:
        head = bytes((0x80 | opcode, bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, bit | 127)) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    mask = os.urandom(4)
    return head + mask + apply_mask(payload, mask)


class FrameIO(asyncio.Protocol):
    """A WebSocket connection; see the module docstring.

    Subclasses set ``is_server``, run the handshake in ``handshake_data`` (calling
    ``opened`` with the bytes that followed it), and implement ``frame_received(data)``
    (one binary message, called from ``data_received``: it must not block and should
    not raise); they may override ``text_received``, ``control_received``,
    ``unencodable``, ``oversized`` and ``on_slow_consumer``.
    """

    is_server = False
    max_size: int | None = 1 << 20       # largest message taken in (frame or fragments)
    max_out_frame = 1 << 20
    max_out_messages = MAX_FRAME_MESSAGES
    max_write_buffer = 64 << 20
    close_timeout = 5.0

    transport: asyncio.Transport

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.state = CONNECTING
        self._out: list[list[Any]] = []
        self._inbuf: bytes | bytearray = b""
        self._fragments: list[bytes] | None = None
        # a fragmented text message's UTF-8 check, fragment by fragment (None: binary)
        self._utf8: codecs.IncrementalDecoder | None = None
        self._fragment_size = 0
        self._lost: asyncio.Future[None] = self.loop.create_future()
        self._heard = False                   # bytes arrived since the last keepalive look
        self._keepalive: tuple[float, float] | None = None
        self._pinged = False
        self._ka_timer: asyncio.TimerHandle | None = None
        self._failed = False                  # fail_now: what arrives is dropped unread
        self.close_code: int | None = None    # the code of the close frame received
        self.close_reason = ""
        self.frames_in = 0
        self.frames_out = 0
        self.messages_out = 0
        self.dropped_out = 0
        self.stamps = False    # the node takes SENT: frames with calls begin with one
        self._stamp = 0.0      # when the outbox's first call was queued (0: none is)

    # -- life ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        if self._ka_timer is not None:
            self._ka_timer.cancel()
            self._ka_timer = None
        if not self._lost.done():
            self._lost.set_result(None)

    def opened(self, rest: bytes) -> None:
        """The handshake succeeded; ``rest`` arrived after it (frames already)."""
        self.state = OPEN
        if rest:
            self._receive(rest)

    async def wait_closed(self) -> None:
        """Until the TCP connection is closed."""
        await asyncio.shield(self._lost)

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """What is queued leaves, then a close frame; waits up to ``close_timeout`` for
        the peer's close (then aborts). Safe to repeat."""
        if self.state is OPEN:
            self.flush()
            self._send_close(code, reason)
        elif self.state is CONNECTING and not self.transport.is_closing():
            self.transport.close()
        if self.state is not CLOSED:
            try:
                async with asyncio.timeout(self.close_timeout):
                    await asyncio.shield(self._lost)
            except TimeoutError:
                self.transport.abort()
                await asyncio.shield(self._lost)

    def fail_now(self, code: int, reason: str) -> None:
        """Send a close frame with ``code`` and end the connection; safe to repeat. A
        server over plain TCP follows the close frame with a FIN and reads and drops,
        unparsed, what the peer still sends until it closes, for at most ``CLOSE_GRACE``
        seconds (closing on unread bytes would reset the connection, and a peer still
        sending would lose the close frame); otherwise the connection closes at once,
        its buffered bytes given ``CLOSE_GRACE`` seconds. Either way a peer that does
        not read or close cannot hold it open past the grace."""
        if self.state is OPEN:
            self._send_close(code, reason)
        if self.state is not CLOSED:
            self.state = CLOSING
        transport = self.transport
        if transport.is_closing() or self._failed:
            return
        self._failed = True
        self._inbuf = b""
        if self.is_server and transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(CLOSE_GRACE, transport.abort)
            return
        transport.close()
        if transport.get_write_buffer_size():
            self.loop.call_later(CLOSE_GRACE, transport.abort)

    def _send_close(self, code: int, reason: str) -> None:
        self.state = CLOSING
        payload = b"" if code == CloseCode.NO_STATUS_RCVD else \
            code.to_bytes(2, "big") + reason.encode()[:123]
        self.transport.write(frame(0x8, payload, not self.is_server))

    # -- keepalive -------------------------------------------------------------------

    def start_keepalive(self, interval: float | None, timeout: float | None) -> None:
        """Ping after ``interval`` s in which nothing arrived; fail (1011) when nothing
        arrives within ``timeout`` s (None: wait for ever) more. None: no pings."""
        if interval:
            self._keepalive = (interval, timeout or float("inf"))
            self._ka_timer = self.loop.call_later(interval, self._keepalive_due)

    def _keepalive_due(self) -> None:
        self._ka_timer = None
        if self.state is not OPEN or self._keepalive is None:
            return
        interval, timeout = self._keepalive
        if self._heard:
            self._heard = self._pinged = False
            self._ka_timer = self.loop.call_later(interval, self._keepalive_due)
        elif self._pinged and timeout != float("inf"):
            self.fail_now(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
        else:  # silent for ``interval``: a ping (again, when it waits for ever)
            self._pinged = True
            self.transport.write(frame(0x9, b"", not self.is_server))
            self._ka_timer = self.loop.call_later(
                timeout if timeout != float("inf") else interval, self._keepalive_due)

    # -- in --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._failed or self.close_code is not None:
            return  # failed, or the peer closed: nothing after is read
        self._heard = True
        state = self.state
        if state is OPEN or state is CLOSING:
            self._receive(data)
        elif state is CONNECTING:
            self.handshake_data(data)

    def handshake_data(self, data: bytes) -> None:
        """Bytes before the connection is open: the subclass's handshake."""
        raise NotImplementedError

    def _receive(self, data: bytes) -> None:
        if self._inbuf:
            buf = self._inbuf  # a bytearray: appending is amortised O(1)
            buf += data
        else:
            buf = data
        n = len(buf)
        pos = 0
        server = self.is_server
        limit = self.max_size
        while n - pos >= 2:
            b1 = buf[pos + 1]
            length = b1 & 0x7F
            head = pos + 2
            if length == 126:
                if n - head < 2:
                    break
                length = int.from_bytes(buf[head:head + 2], "big")
                head += 2
            elif length == 127:
                if n - head < 8:
                    break
                length = int.from_bytes(buf[head:head + 8], "big")
                head += 8
                if length >> 63:  # RFC 6455 5.2: the most significant bit must be 0
                    self._inbuf = b""
                    self.fail_now(CloseCode.PROTOCOL_ERROR, "a 64-bit length with its top bit set")
                    return
            if limit is not None and length > limit:
                self._inbuf = b""
                self.fail_now(CloseCode.MESSAGE_TOO_BIG, f"a frame over {limit} bytes")
                return
            masked = b1 & 0x80
            if masked:
                head += 4
            end = head + length
            if end > n:
                break
            b0 = buf[pos]
            if b0 == 0x82 and (not masked) is not server and self._fragments is None:
                self.frames_in += 1
                self.frame_received(apply_mask(buf[head:end], buf[head - 4:head])
                                    if masked else buf[head:end])
            else:
                payload = buf[head:end]
                if masked:
                    payload = apply_mask(payload, buf[head - 4:head])
                self._frame(b0, bool(masked), payload)
            pos = end
            if self.state is not OPEN and (self.state is CLOSED or self._failed
                                           or self.transport.is_closing()):
                self._inbuf = b""  # failed (or closed): nothing after that frame is read
                return
        if pos == 0 and buf is self._inbuf:
            return  # still waiting for the rest of the same frame
        self._inbuf = bytearray(buf[pos:]) if pos < n else b""

    def _frame(self, b0: int, masked: bool, payload: FrameData) -> None:
        """Any frame but a plain binary message: control frames, text, fragments, and
        the broken ones (which fail the connection)."""
        opcode = b0 & 0x0F
        fin = b0 & 0x80
        if b0 & 0x70:
            return self.fail_now(CloseCode.PROTOCOL_ERROR, "reserved bits set")
        if masked is not self.is_server:
            return self.fail_now(CloseCode.PROTOCOL_ERROR,
                                 "an unmasked frame from a client" if self.is_server
                                 else "a masked frame from a server")
        if opcode >= 0x8:
            if not fin or len(payload) > 125:
                return self.fail_now(CloseCode.PROTOCOL_ERROR,
                                     "a fragmented or long control frame")
            if opcode == 0x8:
                return self._close_received(bytes(payload))
            if opcode == 0x9 or opcode == 0xA:
                if self.control_received() and opcode == 0x9 and self.state is OPEN:
                    self.transport.write(frame(0xA, bytes(payload), not self.is_server))
                return None
            return self.fail_now(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
        limit = self.max_size
        if opcode == 0x0:
            fragments = self._fragments
            if fragments is None:
                return self.fail_now(CloseCode.PROTOCOL_ERROR,
                                     "a continuation frame with no message to continue")
            self._fragment_size += len(payload)
            if limit is not None and self._fragment_size > limit:
                return self.fail_now(CloseCode.MESSAGE_TOO_BIG,
                                     f"a message over {limit} bytes")
            utf8 = self._utf8
            if utf8 is None:
                fragments.append(bytes(payload))
            else:  # text: checked as it comes (fails at the first bad byte), not kept
                try:
                    utf8.decode(payload, bool(fin))
                except UnicodeDecodeError:
                    return self.fail_now(CloseCode.INVALID_DATA, "a text message not UTF-8")
            if fin:
                self._fragments = self._utf8 = None
                self.frames_in += 1
                if utf8 is not None:
                    self.text_received()
                else:
                    self.frame_received(b"".join(fragments))
            return None
        if opcode not in (0x1, 0x2):
            return self.fail_now(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if self._fragments is not None:
            return self.fail_now(CloseCode.PROTOCOL_ERROR,
                                 "a new message inside a fragmented one")
        if opcode == 0x1:  # text: valid UTF-8 (RFC 6455 8.1) or the connection fails
            utf8 = codecs.getincrementaldecoder("utf-8")()
            try:
                utf8.decode(payload, bool(fin))
            except UnicodeDecodeError:
                return self.fail_now(CloseCode.INVALID_DATA, "a text message not UTF-8")
        if not fin:
            self._fragments = [] if opcode == 0x1 else [bytes(payload)]
            self._utf8 = utf8 if opcode == 0x1 else None
            self._fragment_size = len(payload)
        else:
            self.frames_in += 1
            if opcode == 0x1:
                self.text_received()
            else:
                self.frame_received(payload)
        return None

    def _close_received(self, payload: bytes) -> None:
        """The peer's close frame: answered (when we did not close first), then the TCP
        connection closes."""
        if len(payload) == 1:
            return self.fail_now(CloseCode.PROTOCOL_ERROR, "a close frame of one byte")
        code = int.from_bytes(payload[:2], "big") if payload else CloseCode.NO_STATUS_RCVD
        if payload and not valid_close_code(code):
            return self.fail_now(CloseCode.PROTOCOL_ERROR, f"close code {code} may not be sent")
        try:
            self.close_reason = payload[2:].decode("utf-8")
        except UnicodeDecodeError:
            return self.fail_now(CloseCode.INVALID_DATA, "a close reason not UTF-8")
        self.close_code = code
        if self.state is OPEN:
            self.flush()
            self._send_close(self.close_code, "")
        self.state = CLOSING
        self.transport.close()
        return None

    def frame_received(self, data: FrameData) -> None:
        raise NotImplementedError

    def text_received(self) -> None:
        """A text message; the protocol is binary only. Default: ignore."""

    def control_received(self) -> bool:
        """A ping or pong arrived, called once per frame before it is answered: True lets
        a ping be answered, False drops it (the subclass has failed the connection).
        Default: True."""
        return True

    # -- out -------------------------------------------------------------------------

    def send(self, msg: list[Any]) -> None:
        """Queue a message; it leaves with everything else queued in this loop tick."""
        out = self._out
        out.append(msg)
        if len(out) == 1:
            self.loop.call_soon(self.flush)

    def send_call(self, msg: list[Any]) -> None:
        """Queue a call (REQUEST, STREAM, ALL): with ``stamps``, its frame begins with a
        SENT saying when its first call was queued (its caller's clock runs from then),
        so the node counts the time it took to be read, this process's own lag too."""
        if self.stamps and not self._stamp:
            self._stamp = self.loop.time()
        out = self._out  # ``send``'s body: a call's own path saves a frame here
        out.append(msg)
        if len(out) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write everything queued as one frame (more only when over ``max_out_frame``)."""
        out = self._out
        if not out:
            return
        self._out = []
        stamp, self._stamp = self._stamp, 0.0
        if self.state is not OPEN:
            self.dropped_out += len(out)
            return
        if stamp:
            out.insert(0, [SENT, int(stamp * 1000)])
        try:
            data = encode(out)
        except (TypeError, ValueError, OverflowError):
            frames = self._encode_each(out, bool(stamp))
        else:
            frames = [data] if len(data) <= self.max_out_frame and \
                len(out) <= self.max_out_messages else self._encode_each(out, bool(stamp))
        write = self.transport.write
        if self.is_server:
            for data in frames:
                write(ws_header(len(data), 0) + data)
        else:  # clients mask every frame (RFC 6455 5.3)
            for data in frames:
                mask = os.urandom(4)
                write(ws_header(len(data), 0x80) + mask + apply_mask(data, mask))
        self.frames_out += len(frames)
        self.messages_out += len(out)
        if self.transport.get_write_buffer_size() > self.max_write_buffer:
            self.on_slow_consumer()

    def _encode_each(self, out: list[list[Any]], stamped: bool = False) -> list[bytes]:
        """Each message packed alone (what msgpack refuses goes to ``unencodable``, one
        over ``max_out_frame`` to ``oversized``), then grouped into bounded frames.
        ``stamped``: ``out`` begins with a SENT, which then begins every frame (the node
        takes a frame without one as not having waited)."""
        parts = []
        limit = self.max_out_frame
        head = _packb(out[0]) if stamped else b""
        for msg in out[1:] if stamped else out:
            try:
                part = _packb(msg)
            except (TypeError, ValueError, OverflowError) as exc:
                replacement = self.unencodable(msg, exc)
                if replacement is not None:
                    parts.append(_packb(replacement))
                continue
            if len(part) > limit:
                replacement = self.oversized(msg, len(part))
                if replacement is None:
                    continue
                if replacement is not msg:
                    part = _packb(replacement)
            parts.append(part)
        return pack_in_frames(parts, limit, self.max_out_messages, head) if parts else []

    def oversized(self, msg: list[Any], size: int) -> list[Any] | None:
        """A message of ``size`` bytes, over ``max_out_frame``: return it to send it alone
        anyway (the default), a replacement, or None to drop it."""
        return msg

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        """A queued message msgpack cannot encode: return a replacement, or None to drop it."""
        self.dropped_out += 1
        return None

    def on_slow_consumer(self) -> None:
        """The peer is not reading: close rather than buffer without bound."""
        self.fail_now(CloseCode.TRY_AGAIN_LATER, "slow consumer: write buffer full")
