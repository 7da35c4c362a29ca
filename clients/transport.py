"""Frames in as they arrive, messages out coalesced per loop tick: the I/O half of a connection.

``FrameIO`` is mixed into websockets' asyncio ``ServerConnection`` (the broker's
sessions) and ``ClientConnection`` (the SDK). websockets keeps doing the
handshake, control frames, keepalive and the closing handshake; we take data
frames straight from its sans-I/O protocol in ``data_received`` — no Task,
queue or future per message — and write through the same protocol object.

Writes: ``send(msg)`` appends to an outbox; the first message of a tick
schedules one ``flush`` with ``call_soon``, which encodes the whole outbox as
one frame (split only where it would exceed ``max_out_frame``). A peer that
stops reading makes its transport buffer grow; past ``max_write_buffer`` bytes
the connection is closed (``on_slow_consumer``) rather than growing memory
without bound. Messages sent after the connection closed are dropped and
counted in ``dropped_out``.
"""

from __future__ import annotations

from typing import Any

import msgpack
from websockets.frames import BINARY, CONT, TEXT, CloseCode
from websockets.protocol import OPEN

from .protocol import encode

_packb = msgpack.packb


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def pack_in_frames(parts: list[bytes], max_frame: int) -> list[bytes]:
    """Group already-packed messages into frames of at most ``max_frame`` bytes.

    A frame of one message is that message; several make a msgpack array. A
    single message larger than ``max_frame`` still goes out alone.
    """
    frames: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for part in parts:
        if group and size + len(part) + 5 > max_frame:
            frames.append(group[0] if len(group) == 1 else _array_header(len(group)) + b"".join(group))
            group, size = [], 0
        group.append(part)
        size += len(part)
    if group:
        frames.append(group[0] if len(group) == 1 else _array_header(len(group)) + b"".join(group))
    return frames


class FrameIO:
    """Mixin for a websockets asyncio connection; see the module docstring.

    Subclasses implement ``frame_received(data)`` (one binary message, called
    from ``data_received``: it must not block and should not raise) and may
    override ``text_received``, ``unencodable`` and ``on_slow_consumer``.
    """

    max_out_frame = 1 << 20
    max_write_buffer = 64 << 20

    def _init_frame_io(self) -> None:
        self._out: list[list[Any]] = []
        self._fragments: list[bytes] | None = None
        self._fragment_text = False
        self.frames_in = 0
        self.frames_out = 0
        self.messages_out = 0
        self.dropped_out = 0

    # -- in --------------------------------------------------------------------------

    def _frame_event(self, event: Any) -> None:
        """Route a frame event after the handshake (call from ``process_event``)."""
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
        else:
            self._control_event(event)

    def _control_event(self, event: Any) -> None:
        raise NotImplementedError  # set by the concrete class to its base's process_event

    def frame_received(self, data: bytes) -> None:
        raise NotImplementedError

    def text_received(self) -> None:
        """A text frame; the protocol is binary only. Default: ignore."""

    # -- out -------------------------------------------------------------------------

    def send(self, msg: list[Any]) -> None:
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
            frames = [data] if len(data) <= self.max_out_frame or len(out) == 1 else \
                pack_in_frames([_packb(m) for m in out], self.max_out_frame)
        protocol = self.protocol
        for frame in frames:
            protocol.send_binary(frame)
        self.frames_out += len(frames)
        self.messages_out += len(out)
        self.send_data()
        if self.transport.get_write_buffer_size() > self.max_write_buffer:
            self.on_slow_consumer()

    def _encode_each(self, out: list[list[Any]]) -> list[bytes]:
        parts = []
        for msg in out:
            try:
                parts.append(_packb(msg))
            except (TypeError, ValueError, OverflowError) as exc:
                replacement = self.unencodable(msg, exc)
                if replacement is not None:
                    parts.append(_packb(replacement))
        return pack_in_frames(parts, self.max_out_frame) if parts else []

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        """A queued message msgpack cannot encode: return a replacement, or None to drop it."""
        self.dropped_out += 1
        return None

    def on_slow_consumer(self) -> None:
        """The peer is not reading: close rather than buffer without bound."""
        self.fail_now(CloseCode.TRY_AGAIN_LATER, "slow consumer: write buffer full")

    def fail_now(self, code: int, reason: str) -> None:
        """Send a close frame with ``code`` and close the TCP connection; safe to repeat."""
        if self.protocol.state is OPEN:
            self.protocol.fail(code, reason)
            self.send_data()
        self.transport.close()

