"""WebSocket frames as the wire carries them, built and read byte by byte for the tests
that hold our stack to RFC 6455 (tests/inproc/test_rfc6455.py, tests/unit/test_frame_fuzz.py):
nothing here is our stack's own code."""

from __future__ import annotations

import os


def mask(payload: bytes, key: bytes) -> bytes:
    return bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def raw_frame(opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0,
              masked: bool, length: int | None = None) -> bytes:
    """One frame; ``length`` overrides the length field (a lie the payload does not keep)."""
    n = len(payload) if length is None else length
    head = bytes(((0x80 if fin else 0) | rsv << 4 | opcode,))
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes((bit | n,))
    elif n < 0x10000:
        head += bytes((bit | 126,)) + n.to_bytes(2, "big")
    else:
        head += bytes((bit | 127,)) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + mask(payload, key)


def parse_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole frames at the start of ``buf`` as (opcode, unmasked payload), and the
    bytes after them."""
    frames = []
    while len(buf) >= 2:
        n, head = buf[1] & 0x7F, 2
        if n == 126:
            n, head = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            n, head = int.from_bytes(buf[2:10], "big"), 10
        key = buf[head:head + 4] if buf[1] & 0x80 else b""
        head += len(key)
        if len(buf) < head + n:
            break
        payload = buf[head:head + n]
        frames.append((buf[0] & 0x0F, mask(payload, key) if key else payload))
        buf = buf[head + n:]
    return frames, buf


def close_code(payload: bytes) -> int | None:
    """A close frame's code; None for an empty close frame."""
    return int.from_bytes(payload[:2], "big") if payload else None
