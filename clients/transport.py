"""Frames in as they arrive, messages out coalesced per loop tick: the I/O half of a connection.

``FrameIO`` is mixed into websockets' asyncio ``ServerConnection`` (the broker's
sessions) and ``ClientConnection`` (the SDK). websockets does the opening
handshake (and the HTTP answers of ``process_request``), control frames,
keepalive pings, fragmented or text frames, and the closing handshake.

The data path is ours, because per-message cost decides a broker's speed
(websockets' general parser costs ~7 µs per frame on this machine kind, this
one ~1 µs): once the connection is open and websockets has no partial frame
buffered, ``data_received`` parses complete, unfragmented binary frames
itself and hands each payload to ``frame_received`` — no Task, queue or
future per message. Any other frame, an oversized one, or one masked the
wrong way is handed to websockets exactly at a frame boundary, so its rules
(close codes 1002, 1009, ...) apply unchanged; fast parsing resumes when its
buffer is empty again. A partial frame waits in a buffer bounded by the
maximum frame size. Every ping and pong is offered to ``control_received``
first (the node prices them); before fast parsing starts, websockets is given
``SLICE`` bytes at a time and nothing once the connection is closing, so a
flood of tiny frames cannot cost more than a slice after its close.

Writes: ``send(msg)`` appends to an outbox; the first message of a tick
schedules one ``flush`` with ``call_soon``, which encodes the whole outbox as
one frame (split only where it would exceed ``max_out_frame``; one message
over that goes to ``oversized``) and writes it with one ``transport.write``. A peer that stops
reading makes its transport
buffer grow; past ``max_write_buffer`` bytes the connection is closed
(``on_slow_consumer``) rather than growing memory without bound. Messages
sent after the connection closed are dropped and counted in ``dropped_out``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import msgpack
from websockets.frames import BINARY, CLOSE, CONT, TEXT, CloseCode, Frame
from websockets.protocol import OPEN, SERVER

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

from rpcbus.protocol import MAX_FRAME_MESSAGES, encode

_packb = msgpack.packb

SLICE = 4096        # bytes handed to websockets' parser at a time (see data_received)
CLOSE_GRACE = 1.0   # s a failed connection's buffered bytes get before it is aborted

#: One binary WebSocket message as the read path hands it over (no copy made).
FrameData = bytes | bytearray | memoryview

if TYPE_CHECKING:  # what the mixin is mixed into (it calls up to its methods)
    from websockets.asyncio.connection import Connection as _Connection
else:
    _Connection = object


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
                   max_messages: int = MAX_FRAME_MESSAGES) -> list[bytes]:
    """Group already-packed messages into frames of at most ``max_frame`` bytes and
    ``max_messages`` messages.

    A frame of one message is that message; several make a msgpack array. A
    single message larger than ``max_frame`` still goes out alone.
    """
    frames: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for part in parts:
        if group and (size + len(part) + 5 > max_frame or len(group) >= max_messages):
            frames.append(group[0] if len(group) == 1
                          else _array_header(len(group)) + b"".join(group))
            group, size = [], 0
        group.append(part)
        size += len(part)
    if group:
        frames.append(group[0] if len(group) == 1 else _array_header(len(group)) + b"".join(group))
    return frames


def _at_frame_boundary(protocol: Any) -> bool:
    """True when websockets' parser holds no bytes and waits for the start of a frame.

    Its parser is a generator; between frames it is suspended in the stream
    reader's ``at_eof`` (the top of its frame loop), anywhere else it is inside
    a frame. Should a websockets release change that shape, this answers False
    and the connection simply stays on websockets' parser.
    """
    reader = getattr(protocol, "reader", None)
    if reader is None or getattr(reader, "buffer", True):
        return False
    gen = getattr(protocol, "parser", None)
    while (inner := getattr(gen, "gi_yieldfrom", None)) is not None:
        gen = inner
    return getattr(getattr(gen, "gi_code", None), "co_name", "") == "at_eof"


class FrameIO(_Connection):
    """Mixin for a websockets asyncio connection; see the module docstring.

    List it first: ``class Session(FrameIO, ServerConnection)``. Subclasses
    implement ``frame_received(data)`` (one binary message, called from
    ``data_received``: it must not block and should not raise) and may
    override ``text_received``, ``unencodable`` and ``on_slow_consumer``.
    """

    max_out_frame = 1 << 20
    max_out_messages = MAX_FRAME_MESSAGES
    max_write_buffer = 64 << 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out: list[list[Any]] = []
        self._fragments: list[bytes] | None = None
        self._fragment_text = False
        self._fast = False                    # parsing data frames ourselves
        self._priced = False                  # the control frame handed over was priced
        self._inbuf: bytes | bytearray = b""  # a partial frame, in fast mode
        self._server_side = self.protocol.side is SERVER
        self.frames_in = 0
        self.fast_frames_in = 0  # parsed by the fast path (the rest went through websockets)
        self.frames_out = 0
        self.messages_out = 0
        self.dropped_out = 0

    # -- in --------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._fast:
            self._fast_receive(data)
            return
        # The handshake, or websockets mid-frame: it parses every frame of what it is
        # given before any reaches us, so it gets SLICE bytes at a time, and nothing more
        # once the connection is closing (a flood of tiny control frames costs one slice).
        pos = 0
        while pos < len(data):
            if self.protocol.state is OPEN and _at_frame_boundary(self.protocol):
                self._fast = True  # from here on websockets only ever sees whole frames
                self._fast_receive(data[pos:] if pos else data)
                return
            super().data_received(data[pos:pos + SLICE])
            pos += SLICE
            if self.transport.is_closing():
                return

    def _fast_receive(self, data: bytes) -> None:
        if self._inbuf:
            buf = self._inbuf  # a bytearray: appending is amortised O(1)
            buf += data
        else:
            buf = data
        n = len(buf)
        pos = 0
        server = self._server_side
        limit = self.protocol.max_message_size
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
            if limit is not None and length > limit:
                # websockets fails the connection with 1009 (or 1002 for a control frame).
                self._inbuf = b""
                self._fast = False
                super().data_received(bytes(buf[pos:]))
                return
            masked = b1 & 0x80
            if masked:
                head += 4
            end = head + length
            if end > n:
                break
            if buf[pos] == 0x82 and (not masked) is not server and self._fragments is None:
                payload = apply_mask(buf[head:end], buf[head - 4:head]) if masked else buf[head:end]
                self.frames_in += 1
                self.fast_frames_in += 1
                self.frame_received(payload)
            else:
                # A control, text or fragment frame, or one masked the wrong way: exactly
                # this one frame goes to websockets, which stays at a frame boundary. A
                # ping or pong is priced first (websockets answers a ping as it parses).
                if (buf[pos] & 0x0F) in (0x9, 0xA):  # ping, pong
                    if not self.control_received():
                        self._inbuf = b""
                        return
                    self._priced = True
                super().data_received(bytes(buf[pos:end]))
            pos = end
            if self.protocol.state is not OPEN:
                self._inbuf = b""
                return
        if pos == 0 and buf is self._inbuf:
            return  # still waiting for the rest of the same frame
        self._inbuf = bytearray(buf[pos:]) if pos < n else b""

    def process_event(self, event: Any) -> None:
        """websockets' hook: the handshake event goes to it, frames come here."""
        if isinstance(event, Frame):
            self._frame_event(event)
        else:
            super().process_event(event)

    def _frame_event(self, event: Frame) -> None:
        opcode = event.opcode
        if opcode is BINARY or opcode is TEXT:
            if event.fin:
                self.frames_in += 1
                if opcode is BINARY:
                    self.frame_received(event.data)
                else:
                    self.text_received()
            else:
                self._fragments = [bytes(event.data)]
                self._fragment_text = opcode is TEXT
        elif opcode is CONT:
            if self._fragments is None:  # the protocol parser already rejects this
                return
            self._fragments.append(bytes(event.data))
            if event.fin:
                data = b"".join(self._fragments)
                self._fragments = None
                self.frames_in += 1
                if self._fragment_text:
                    self.text_received()
                else:
                    self.frame_received(data)
        elif opcode is CLOSE or self._priced or self.control_received():
            self._priced = False
            super().process_event(event)  # websockets matches pongs, closes

    def frame_received(self, data: FrameData) -> None:
        raise NotImplementedError

    def text_received(self) -> None:
        """A text frame; the protocol is binary only. Default: ignore."""

    def control_received(self) -> bool:
        """A ping or pong frame arrived, called once per frame. In fast mode it is called
        before websockets sees the frame: True lets websockets handle it (a ping is
        answered with a pong), False drops it (the subclass has failed the connection).
        Before fast mode websockets has answered a ping already; the answer says whether
        to go on. Default: True."""
        return True

    # -- out -------------------------------------------------------------------------

    # The connection's send is the message outbox; websockets' own (a coroutine sending
    # one WebSocket message) is never used on these connections.
    def send(self, msg: list[Any]) -> None:  # type: ignore[override]
        """Queue a message; it leaves with everything else queued in this loop tick."""
        out = self._out
        out.append(msg)
        if len(out) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write everything queued as one frame (more only when over ``max_out_frame``)."""
        out = self._out
        if not out:
            return
        self._out = []
        if self.protocol.state is not OPEN:
            self.dropped_out += len(out)
            return
        try:
            data = encode(out)
        except (TypeError, ValueError, OverflowError):
            frames = self._encode_each(out)
        else:
            frames = [data] if len(data) <= self.max_out_frame and \
                len(out) <= self.max_out_messages else self._encode_each(out)
        write = self.transport.write
        if self._server_side:
            for frame in frames:
                write(ws_header(len(frame), 0) + frame)
        else:  # clients mask every frame (RFC 6455 5.3)
            for frame in frames:
                mask = os.urandom(4)
                write(ws_header(len(frame), 0x80) + mask + apply_mask(frame, mask))
        self.frames_out += len(frames)
        self.messages_out += len(out)
        if self.transport.get_write_buffer_size() > self.max_write_buffer:
            self.on_slow_consumer()

    def _encode_each(self, out: list[list[Any]]) -> list[bytes]:
        """Each message packed alone (what msgpack refuses goes to ``unencodable``, one
        over ``max_out_frame`` to ``oversized``), then grouped into bounded frames."""
        parts = []
        limit = self.max_out_frame
        for msg in out:
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
        return pack_in_frames(parts, limit, self.max_out_messages) if parts else []

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

    def fail_now(self, code: int, reason: str) -> None:
        """Send a close frame with ``code`` and close the TCP connection; safe to repeat.
        What is still buffered gets ``CLOSE_GRACE`` seconds to leave, then the connection
        is aborted: a peer that does not read cannot hold it open."""
        if self.protocol.state is OPEN:
            self.protocol.fail(code, reason)
            self.send_data()
        transport = self.transport
        if transport.is_closing():
            return
        transport.close()
        if transport.get_write_buffer_size():
            self.loop.call_later(CLOSE_GRACE, transport.abort)

