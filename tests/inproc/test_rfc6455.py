"""RFC 6455 conformance of both ends of our WebSocket stack (clients/transport.py and
clients/websocket.py), case by case, grouped as the Autobahn TestSuite's catalogue groups
them: framing (1), pings and pongs (2), reserved bits (3), opcodes (4), fragmentation
(5), UTF-8 (6), closing (7), limits (9) and masking.

A case is the bytes a peer sends and what the RFC requires back: ``Open`` (the
connection goes on: every message arrives whole and in order, each ping is answered
with its payload, and a probe sent after the case is read) or ``Closes`` (a close frame
with that code, or an empty one, and nothing sent after the case read). The same
catalogue runs against a node's server over real TCP (the case's frames masked, as a
client sends them) and against the SDK's client end (``dial`` to a server written here
that answers the handshake and sends the case's frames unmasked). The node's rpcbus
PING answers each binary message with its data, so the node shows what it received.

Where we differ from Autobahn's expectations, by design: our protocol is binary, so a
valid text message is refused at the application level (the node answers ERROR
INVALID_MESSAGE; the SDK drops it) rather than echoed, and the node prices pings
(``limits.max_control_frames`` per window, then 1008).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from dataclasses import dataclass, field

import pytest

from rpcbus import protocol as p
from rpcbus.transport import FrameData
from rpcbus.websocket import ClientConnection, dial

from ..timing import wait
from ..wsframes import close_code, parse_frames, raw_frame

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WAIT = wait(10.0)  # s any one exchange may take (a loaded host)


def msg(tag: str, size: int = 0) -> bytes:
    """A binary message of exactly ``size`` bytes (at least its tag's): an rpcbus PING
    whose data is ``tag`` padded, which the node answers with a PONG of the same."""
    data = tag.encode()
    body = p.encode([[p.PING, data]])
    while len(body) < size:
        data += b"." * (size - len(body))
        body = p.encode([[p.PING, data]])
        if len(body) > size:  # a longer length prefix: take back what it cost
            data = data[:len(data) - (len(body) - size)]
            body = p.encode([[p.PING, data]])
    assert not size or len(body) == size, (size, len(body))
    return body


# -- the catalogue -------------------------------------------------------------------

@dataclass(frozen=True)
class F:
    """A frame of a case, masked or not by the side that sends it."""

    opcode: int
    payload: bytes = b""
    fin: bool = True
    rsv: int = 0
    length: int | None = None


@dataclass(frozen=True)
class Open:
    messages: list[bytes] = field(default_factory=list)  # binary messages, whole, in order
    pongs: list[bytes] = field(default_factory=list)     # pong payloads, in order


@dataclass(frozen=True)
class Closes:
    code: int | None  # the close frame's code; None: an empty close frame


BIN, TEXT, CONT, CLOSE, PING, PONG = 0x2, 0x1, 0x0, 0x8, 0x9, 0xA


def close(code: int, reason: bytes = b"") -> F:
    return F(CLOSE, code.to_bytes(2, "big") + reason)


M = msg("m")
KOSME = "κόσμε".encode()
SURROGATE = b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"

CASES: dict[str, tuple[list[F], Open | Closes, int]] = {
    # 1: framing: every length encoding, whole and chopped (last: bytes per write)
    **{f"1.2 binary of {n} bytes": ([F(BIN, msg("len", n))], Open([msg("len", n)]), 0)
       for n in (16, 125, 126, 127, 128, 65535, 65536, 300_000)},
    "1.2.8 binary of 65536 bytes, chopped": ([F(BIN, msg("c", 65536))],
                                            Open([msg("c", 65536)]), 997),
    "1.1 text of 0 and 126 bytes": ([F(TEXT), F(TEXT, b"*" * 126)], Open(), 0),
    "1.x three messages chopped to single bytes": (
        [F(BIN, msg("a")), F(BIN, msg("b", 200)), F(BIN, msg("c"))],
        Open([msg("a"), msg("b", 200), msg("c")]), 1),
    # 2: pings and pongs
    "2.1 ping without payload": ([F(PING)], Open(pongs=[b""]), 0),
    "2.2 ping with text payload": ([F(PING, b"Hello, world!")], Open(pongs=[b"Hello, world!"]), 0),
    "2.3 ping with binary payload": ([F(PING, bytes(range(8)) * 4)],
                                     Open(pongs=[bytes(range(8)) * 4]), 0),
    "2.4 ping of 125 bytes": ([F(PING, b"\xfe" * 125)], Open(pongs=[b"\xfe" * 125]), 0),
    "2.5 ping of 126 bytes": ([F(PING, b"\xfe" * 126), F(BIN, M)], Closes(1002), 0),
    "2.6 ping of 125 bytes chopped": ([F(PING, b"x" * 125)], Open(pongs=[b"x" * 125]), 1),
    "2.7 unsolicited pong without payload": ([F(PONG)], Open(), 0),
    "2.8 unsolicited pong with payload": ([F(PONG, b"unsolicited")], Open(), 0),
    "2.9 unsolicited pong, then ping": ([F(PONG, b"unsolicited"), F(PING, b"ping")],
                                        Open(pongs=[b"ping"]), 0),
    "2.10 ten pings in a row": ([F(PING, b"%d" % i) for i in range(10)],
                                Open(pongs=[b"%d" % i for i in range(10)]), 0),
    # 3: reserved bits (no extension was negotiated)
    "3.1 text with RSV1": ([F(TEXT, b"x", rsv=4)], Closes(1002), 0),
    "3.2 binary with RSV2, after a good message": ([F(BIN, M), F(BIN, M, rsv=2)],
                                                   Closes(1002), 0),
    "3.3 binary with RSV3": ([F(BIN, M, rsv=1)], Closes(1002), 0),
    "3.4 ping with RSV1 and RSV3": ([F(PING, b"x", rsv=5)], Closes(1002), 0),
    "3.5 close with RSV": ([F(CLOSE, (1000).to_bytes(2, "big"), rsv=7)], Closes(1002), 0),
    "3.6 continuation with RSV1": ([F(BIN, M[:2], fin=False), F(CONT, M[2:], rsv=4)],
                                   Closes(1002), 0),
    # 4: opcodes reserved for later (non-control 3-7, control 11-15)
    **{f"4.{1 if op < 8 else 2} opcode {op}": ([F(BIN, M), F(op, b"reserved"), F(PING)],
                                               Closes(1002), 0)
       for op in (3, 4, 5, 6, 7, 11, 12, 13, 14, 15)},
    # 5: fragmentation
    "5.1 ping in two fragments": ([F(PING, b"frag", fin=False), F(CONT, b"ment")],
                                  Closes(1002), 0),
    "5.2 pong in two fragments": ([F(PONG, b"frag", fin=False), F(CONT, b"ment")],
                                  Closes(1002), 0),
    "5.3 text in two fragments": ([F(TEXT, b"frag", fin=False), F(CONT, b"ment")], Open(), 0),
    "5.4 binary in two fragments": ([F(BIN, M[:3], fin=False), F(CONT, M[3:])], Open([M]), 0),
    "5.5 binary in one-byte fragments": (
        [F(BIN, M[:1], fin=False), *(F(CONT, M[i:i + 1], fin=False) for i in range(1, len(M) - 1)),
         F(CONT, M[-1:])], Open([M]), 0),
    "5.6 ping between fragments": (
        [F(BIN, M[:3], fin=False), F(PING, b"mid"), F(CONT, M[3:])],
        Open([M], pongs=[b"mid"]), 0),
    "5.7 pong between fragments": ([F(BIN, M[:3], fin=False), F(PONG, b"mid"), F(CONT, M[3:])],
                                   Open([M]), 0),
    "5.8 a ping between each of many fragments, chopped": (
        [F(BIN, M[:2], fin=False), F(PING, b"1"), F(CONT, M[2:4], fin=False), F(PING, b"2"),
         F(CONT, M[4:])], Open([M], pongs=[b"1", b"2"]), 1),
    "5.9 continuation with nothing to continue, final": ([F(CONT, b"x")], Closes(1002), 0),
    "5.10 continuation with nothing to continue": ([F(CONT, b"x", fin=False)],
                                                    Closes(1002), 0),
    "5.15 a continuation after the message ended": (
        [F(BIN, M[:3], fin=False), F(CONT, M[3:]), F(CONT, b"x")], Closes(1002), 0),
    "5.17 a new message inside a fragmented one": (
        [F(TEXT, b"a", fin=False), F(BIN, M)], Closes(1002), 0),
    "5.18 a new fragmented message inside one": (
        [F(BIN, M[:2], fin=False), F(BIN, M[2:], fin=False)], Closes(1002), 0),
    "5.19 empty fragments": ([F(BIN, b"", fin=False), F(CONT, b"", fin=False), F(CONT, M)],
                             Open([M]), 0),
    # 6: UTF-8 in text messages
    "6.2 valid multi-byte text": ([F(TEXT, KOSME)], Open(), 0),
    "6.2 valid text split inside its characters": (
        [F(TEXT, KOSME[:1], fin=False),
         *(F(CONT, KOSME[i:i + 1], fin=False) for i in range(1, len(KOSME) - 1)),
         F(CONT, KOSME[-1:])], Open(), 0),
    "6.2 the highest code point and a noncharacter": (
        [F(TEXT, b"\xf4\x8f\xbf\xbf\xef\xbf\xbf")], Open(), 0),
    "6.3 a surrogate in one frame": ([F(TEXT, SURROGATE)], Closes(1007), 0),
    "6.3 a surrogate across fragments": (
        [F(TEXT, SURROGATE[:12], fin=False), F(CONT, SURROGATE[12:])], Closes(1007), 0),
    "6.4 fails at the first bad fragment, the message unfinished": (
        [F(TEXT, b"\xce\xba\xf4\x90\x80\x80", fin=False)], Closes(1007), 0),
    **{f"6.x invalid {bad!r}": ([F(TEXT, bad)], Closes(1007), 0)
       for bad in (b"\xff", b"\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
                   b"\xed\xa0\x80", b"\xe0\x80", b"ok\xce")},
    # 7: closing
    "7.1 close without payload": ([F(CLOSE), F(BIN, M)], Closes(None), 0),
    "7.1 a ping after the close is not read": ([close(1000), F(PING, b"late")],
                                               Closes(1000), 0),
    "7.3 close of one byte": ([F(CLOSE, b"\x03")], Closes(1002), 0),
    "7.3 close with a reason": ([close(1000, b"Hello World!")], Closes(1000), 0),
    "7.3 close with a 123-byte reason": ([close(1000, b"*" * 123)], Closes(1000), 0),
    "7.3 close with a 124-byte reason (a control frame over 125)": (
        [close(1000, b"*" * 124)], Closes(1002), 0),
    "7.5 close reason not UTF-8": ([close(1000, SURROGATE)], Closes(1007), 0),
    **{f"7.7 close code {code} is echoed": ([close(code)], Closes(code), 0)
       for code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014,
                    3000, 3999, 4000, 4999)},
    **{f"7.9 close code {code} may not be sent": ([close(code)], Closes(1002), 0)
       for code in (0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535)},
    # 9: limits (the side's max_size: LIMIT below), and a length the RFC forbids
    "9.x a frame over the size limit": ([F(BIN, b"", length=(1 << 20) + 1)], Closes(1009), 0),
    "9.x fragments over the size limit together": (
        [F(BIN, b"\x00" * (600 << 10), fin=False), F(CONT, b"\x00" * (600 << 10))],
        Closes(1009), 0),
    "10.x a 64-bit length with its top bit set": ([F(BIN, b"", length=1 << 63)],
                                                   Closes(1002), 0),
}
LIMIT = 1 << 20  # both ends' largest message in these runs (the node's default)


def wire(frames: list[F], masked: bool) -> bytes:
    return b"".join(raw_frame(f.opcode, f.payload, fin=f.fin, rsv=f.rsv, masked=masked,
                              length=f.length) for f in frames)


# -- the test's own end: frames read as they come ---------------------------------------

class RawEnd:
    """The test's end of a TCP connection: writes bytes as told, reads frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf = b""
        self.frames: list[tuple[int, bytes]] = []
        self.eof = False

    async def send(self, data: bytes, chop: int = 0) -> None:
        step = chop or len(data) or 1
        for i in range(0, len(data), step):
            self.writer.write(data[i:i + step])
            await self.writer.drain()

    async def read(self) -> None:
        """At least one more frame, or the end of the stream."""
        before = len(self.frames)
        while len(self.frames) == before and not self.eof:
            data = await asyncio.wait_for(self.reader.read(1 << 16), WAIT)
            if not data:
                self.eof = True
            self.buf += data
            self._parse()

    def _parse(self) -> None:
        frames, self.buf = parse_frames(self.buf)
        self.frames += frames

    def closes(self) -> list[bytes]:
        return [data for op, data in self.frames if op == CLOSE]


# -- the node's server end ----------------------------------------------------------------

async def open_to_node(url: str) -> RawEnd:
    host, port = url.removeprefix("ws://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port.rstrip("/")))
    key = base64.b64encode(os.urandom(16))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    assert head.startswith(b"HTTP/1.1 101"), head
    end = RawEnd(reader, writer)
    await end.send(raw_frame(BIN, p.encode([[p.AUTH, {}]]), masked=True))
    while not any(m[0] == p.AUTH_OK for m in node_messages(end)):
        await end.read()
    return end


def node_messages(end: RawEnd) -> list[list[object]]:
    return [m for op, data in end.frames if op == BIN for m in p.decode(data)]


@pytest.mark.parametrize("name", list(CASES))
async def test_the_nodes_server_end(node, name):
    frames, expect, chop = CASES[name]
    end = await open_to_node(node.url)
    probe = msg("probe")
    await end.send(wire(frames, masked=True), chop)
    await end.send(raw_frame(BIN, probe, masked=True))
    if isinstance(expect, Open):
        while not any(m[:2] == [p.PONG, b"probe"] for m in node_messages(end)):
            assert not end.eof and not end.closes(), (end.frames[-3:], end.eof)
            await end.read()
        pongs = [m[1] for m in node_messages(end) if m[0] == p.PONG]
        assert pongs == [p.decode(m)[0][1] for m in expect.messages] + [b"probe"]
        assert [data for op, data in end.frames if op == PONG] == expect.pongs
    else:
        while not end.eof:
            await end.read()
            if end.closes():
                end.writer.close()  # as a client does once it has the close frame
        [reply] = end.closes()
        assert close_code(reply) == expect.code, reply
        assert not any(m[0] == p.PONG and m[1] == b"probe" for m in node_messages(end))
    end.writer.close()


# -- the SDK's client end -----------------------------------------------------------------

class Recorder(ClientConnection):
    """The SDK's client end as the SDK's wire uses it, keeping what it is given."""

    max_size = LIMIT

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[bytes] = []
        self.texts = 0
        self.got_probe = self.loop.create_future()

    def frame_received(self, data: FrameData) -> None:
        if bytes(data) == b"probe":
            self.transport.write(raw_frame(BIN, b"done", masked=True))
            self.got_probe.set_result(None)
        else:
            self.messages.append(bytes(data))

    def text_received(self) -> None:
        self.texts += 1


@pytest.mark.parametrize("name", list(CASES))
async def test_the_sdks_client_end(name):
    frames, expect, chop = CASES[name]
    ends: asyncio.Queue[RawEnd] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        await ends.put(RawEnd(reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await asyncio.wait_for(dial(Recorder, f"ws://127.0.0.1:{port}/"), WAIT)
        end = await ends.get()
        await end.send(wire(frames, masked=False), chop)
        await end.send(raw_frame(BIN, b"probe", masked=False))
        if isinstance(expect, Open):
            await asyncio.wait_for(conn.got_probe, WAIT)
            while not any(op == BIN and data == b"done" for op, data in end.frames):
                await end.read()
            assert conn.messages == expect.messages
            assert [data for op, data in end.frames if op == PONG] == expect.pongs
            assert not end.closes()
        else:
            await asyncio.wait_for(conn.wait_closed(), WAIT)
            while not end.eof:
                await end.read()
            [reply] = end.closes()
            assert close_code(reply) == expect.code, reply
            assert not conn.got_probe.done()
        end.writer.close()
        conn.transport.abort()
    finally:
        server.close()
