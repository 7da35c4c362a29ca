"""WebSocket framing at the byte level: frames split anywhere, every length encoding,
fragments and control frames between data frames, and frames masked the wrong way.

The peer is websockets' sans-I/O client protocol over a plain TCP socket, so the
test decides exactly which bytes reach the node and when.
"""

import asyncio

import pytest
from websockets.client import ClientProtocol
from websockets.frames import CLOSE, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from rpcbus import protocol as p

from ..timing import wait
from .conftest import stats


class BytePeer:
    def __init__(self, reader, writer, proto):
        self.reader, self.writer, self.proto = reader, writer, proto
        self.messages, self.frames = [], []

    @classmethod
    async def open(cls, url):
        uri = parse_uri(url)
        reader, writer = await asyncio.open_connection(uri.host, uri.port)
        proto = ClientProtocol(uri, max_size=None)
        proto.send_request(proto.connect())
        peer = cls(reader, writer, proto)
        peer.flush()
        while not any(isinstance(e, Response) for e in await peer.read_events()):
            pass
        return peer

    def flush(self):
        for data in self.proto.data_to_send():
            self.writer.write(data)

    def take_bytes(self, send):
        """Run ``send`` on the protocol and return the bytes it produced, unsent."""
        send()
        return b"".join(self.proto.data_to_send())

    async def read_events(self):
        data = await asyncio.wait_for(self.reader.read(65536), wait(10))
        if not data:
            self.proto.receive_eof()
        else:
            self.proto.receive_data(data)
        events = self.proto.events_received()
        for e in events:
            if isinstance(e, Frame):
                self.frames.append(e)
                if e.opcode is Opcode.BINARY:
                    self.messages.extend(p.decode(e.data))
        self.flush()  # pongs, close replies
        return events

    async def message(self, kind):
        async with asyncio.timeout(wait(10)):
            while True:
                for m in self.messages:
                    if m[0] == kind:
                        self.messages.remove(m)
                        return m
                await self.read_events()

    async def dribble(self, data, step):
        for i in range(0, len(data), step):
            self.writer.write(data[i:i + step])
            await self.writer.drain()
            await asyncio.sleep(0)


@pytest.mark.parametrize("step", [1, 3, 1000])
async def test_frames_split_at_any_byte_are_reassembled(node, step):
    before = stats(node)["io"].get("frames_in", 0)
    peer = await BytePeer.open(node.url)
    data = peer.take_bytes(lambda: peer.proto.send_binary(p.encode([[p.AUTH, {}]])))
    sizes = [10, 200, 70_000]                 # 7-bit, 16-bit and 64-bit length encodings
    for size in sizes:
        data += peer.take_bytes(
            lambda size=size: peer.proto.send_binary(p.encode([[p.PING, b"x" * size]])))
    data += peer.take_bytes(lambda: peer.proto.send_binary(p.encode([[p.PING, 1], [p.PING, 2]])))
    await peer.dribble(data, step)
    assert (await peer.message(p.AUTH_OK))[1]["protocol"] == 1
    for size in sizes:
        assert (await peer.message(p.PONG))[1] == b"x" * size
    assert [(await peer.message(p.PONG))[1] for _ in range(2)] == [1, 2]
    assert stats(node)["io"]["frames_in"] >= before + 5
    peer.writer.close()


async def test_fragments_and_control_frames_between_data_frames(node):
    peer = await BytePeer.open(node.url)
    auth = p.encode([[p.AUTH, {}]])
    ping = p.encode([[p.PING, "whole"]])
    data = peer.take_bytes(lambda: peer.proto.send_binary(auth))
    data += peer.take_bytes(lambda: peer.proto.send_ping(b"are you there"))
    data += peer.take_bytes(lambda: peer.proto.send_binary(ping[:3], fin=False))
    data += peer.take_bytes(lambda: peer.proto.send_ping(b"mid-fragment"))
    data += peer.take_bytes(lambda: peer.proto.send_continuation(ping[3:], fin=True))
    data += peer.take_bytes(lambda: peer.proto.send_binary(p.encode([[p.PING, "after"]])))
    await peer.dribble(data, 5)
    await peer.message(p.AUTH_OK)
    assert (await peer.message(p.PONG))[1] == "whole"
    assert (await peer.message(p.PONG))[1] == "after"
    pongs = [f.data for f in peer.frames if f.opcode is Opcode.PONG]
    assert pongs == [b"are you there", b"mid-fragment"]
    peer.writer.close()


async def test_an_unmasked_client_frame_closes_with_protocol_error(node):
    peer = await BytePeer.open(node.url)
    auth = peer.take_bytes(lambda: peer.proto.send_binary(p.encode([[p.AUTH, {}]])))
    body = p.encode([[p.PING, 1]])
    unmasked = bytes((0x82, len(body))) + body    # RFC 6455: clients must mask
    peer.writer.write(auth + unmasked)
    closes = []
    while not closes:
        await peer.read_events()
        closes = [f for f in peer.frames if f.opcode is CLOSE]
    assert int.from_bytes(closes[0].data[:2], "big") == 1002
    peer.writer.close()


async def test_a_silent_peer_is_pinged_then_closed_and_a_live_one_is_kept(start_node):
    """Keepalive: after ``server.ping_interval`` without a byte, a ping; nothing within
    ``ping_timeout`` more closes the connection (1011). A peer that answers stays."""
    node = await start_node(RPCBUS_SERVER_PING_INTERVAL="0.2",
                            RPCBUS_SERVER_PING_TIMEOUT="0.2")
    live = await BytePeer.open(node.url)     # answers each ping as it reads it
    silent = await BytePeer.open(node.url)   # reads nothing until the end
    async with asyncio.timeout(wait(10)):
        while sum(f.opcode is Opcode.PING for f in live.frames) < 4:
            await live.read_events()
    assert not [f for f in live.frames if f.opcode is CLOSE]
    closes = []
    async with asyncio.timeout(wait(10)):
        while not closes:
            await silent.read_events()
            closes = [f for f in silent.frames if f.opcode is CLOSE]
    assert int.from_bytes(closes[0].data[:2], "big") == 1011
    assert [f.opcode for f in silent.frames][0] is Opcode.PING
    live.writer.close()
    silent.writer.close()
