"""The WebSocket frame parser (clients/transport.py ``FrameIO``) under generated input,
both as a server (masked frames in) and as a client (unmasked in): any stream of valid
frames, cut anywhere, gives the same messages and pongs as whole; any bytes at all end
in messages or in one close frame with a code RFC 6455 names for the fault, never an
exception, and nothing after the fault is read. Case by case over real connections:
tests/inproc/test_rfc6455.py."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus.transport import FrameData, FrameIO, valid_close_code

from ..wsframes import close_code, parse_frames, raw_frame

LIMIT = 4096  # the parser's max_size here: small, so generated input reaches it


class Transport:
    """What FrameIO asks of its transport, recording what it writes."""

    def __init__(self) -> None:
        self.out = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def write_eof(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0


class Parser(FrameIO):
    max_size = LIMIT

    def __init__(self, is_server: bool) -> None:
        super().__init__()
        self.is_server = is_server
        self.transport: Any = Transport()
        self.messages: list[bytes] = []
        self.texts = 0
        self.opened(b"")

    def frame_received(self, data: FrameData) -> None:
        assert self.state.name == "OPEN", "a message read after the connection failed"
        self.messages.append(bytes(data))

    def text_received(self) -> None:
        self.texts += 1

    def written(self) -> list[tuple[int, bytes]]:
        """The frames it wrote, unmasked."""
        frames, rest = parse_frames(self.transport.out)
        assert not rest
        return frames


def feed(is_server: bool, chunks: list[bytes]) -> Parser:
    """A fresh parser (on a loop of its own, which never runs) fed ``chunks`` in turn."""
    async def run() -> Parser:
        parser = Parser(is_server)
        for chunk in chunks:
            parser.data_received(chunk)
            assert len(parser._inbuf) <= LIMIT + 14, "a partial frame held past the limit"
        return parser
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def cut(data: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


# a message: binary, in 1-4 fragments, with pings between them; or a ping alone
message = st.one_of(
    st.tuples(st.just("binary"), st.binary(max_size=300), st.integers(1, 4),
              st.lists(st.binary(max_size=125), max_size=3)),
    st.tuples(st.just("ping"), st.binary(max_size=125), st.just(1), st.just([])),
    st.tuples(st.just("text"), st.text(max_size=40).map(str.encode), st.integers(1, 4),
              st.just([])),
)


def frames_of(kind: str, payload: bytes, parts: int, pings: list[bytes],
              masked: bool) -> tuple[bytes, list[bytes]]:
    """A message's frames (a ping between each two fragments) and the pongs they ask."""
    if kind == "ping":
        return raw_frame(0x9, payload, masked=masked), [payload]
    step = max(1, -(-len(payload) // parts))
    pieces = [payload[i:i + step] for i in range(0, len(payload), step)] or [b""]
    out, pongs = b"", []
    for i, piece in enumerate(pieces):
        opcode = (0x2 if kind == "binary" else 0x1) if i == 0 else 0x0
        out += raw_frame(opcode, piece, fin=i == len(pieces) - 1, masked=masked)
        if i < len(pieces) - 1 and pings:
            out += raw_frame(0x9, pings[i % len(pings)], masked=masked)
            pongs.append(pings[i % len(pings)])
    return out, pongs


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(message, max_size=8), st.lists(st.integers(0, 1 << 16),
                                                              max_size=12))
def test_valid_frames_cut_anywhere_read_as_whole(is_server, messages, points):
    made = [frames_of(*m, masked=is_server) for m in messages]
    data = b"".join(frames for frames, _ in made)
    whole, pieces = feed(is_server, [data]), feed(is_server, cut(data, points))
    for parser in (whole, pieces):
        assert parser.messages == [m[1] for m in messages if m[0] == "binary"]
        assert parser.texts == sum(m[0] == "text" for m in messages)
        assert parser.written() == [(0xA, pong) for _, pongs in made for pong in pongs]
        assert parser.state.name == "OPEN"


@st.composite
def chunk(draw: st.DrawFn, is_server: bool) -> bytes:
    """Raw bytes, or a frame that is mostly well formed: one flaw at a time is likelier
    to reach the parser's later rules than noise is."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=64))
    opcode = draw(st.sampled_from([0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3, 0xB]))
    if opcode == 0x8 and draw(st.booleans()):  # a close with a code, any code
        payload = draw(st.integers(0, 0xFFFF)).to_bytes(2, "big") + draw(st.binary(max_size=8))
    elif opcode == 0x1:
        payload = draw(st.one_of(st.text(max_size=20).map(str.encode), st.binary(max_size=20)))
    else:
        payload = draw(st.binary(max_size=200))
    return raw_frame(opcode, payload, fin=draw(st.integers(0, 3)) > 0,
                     rsv=draw(st.sampled_from([0] * 7 + [1, 2, 4])),
                     masked=is_server != (draw(st.integers(0, 9)) == 0),
                     length=draw(st.sampled_from([None] * 9 + [1 << 63, LIMIT + 1])))


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_any_bytes_end_in_messages_or_one_close_naming_the_fault(data):
    is_server = data.draw(st.booleans())
    parser = feed(is_server, data.draw(st.lists(chunk(is_server), max_size=10)))
    closes = [payload for op, payload in parser.written() if op == 0x8]
    assert len(closes) <= 1
    if closes:
        code = close_code(closes[0])
        if parser.close_code is None:  # a fault of the input's: the code names it
            assert code in (1002, 1007, 1009)
        else:                          # the peer closed with a code it may send: echoed
            assert parser.close_code == 1005 or valid_close_code(parser.close_code)
            assert code == (None if parser.close_code == 1005 else parser.close_code)
        assert parser.transport.closing and parser.state.name != "OPEN"
    else:
        assert parser.state.name == "OPEN"
