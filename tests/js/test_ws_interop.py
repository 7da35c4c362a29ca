"""Our WebSocket stack beside others' (RFC 6455 case by case: tests/inproc/test_rfc6455.py).

The node's server end with websockets' and aiohttp's clients (Node's ws: the JS SDK's
tests; Chromium: tests/js/test_browser.py): messages of every length encoding both
ways, pings answered, and each library's own close handshake ending 1000 on both sides.
The SDK's client end against websockets', aiohttp's and Node's ws servers echoing: the
same messages back whole, the server's pings answered, and our close answered 1000."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any, AsyncIterator

import aiohttp
import pytest
import websockets.asyncio.client
import websockets.asyncio.server
from aiohttp import web

from rpcbus import protocol as p
from rpcbus.broker.process import NodeProcess
from rpcbus.transport import FrameData, frame
from rpcbus.websocket import ClientConnection, dial

from ..integration.conftest import FAST
from ..timing import wait
from .conftest import JS, node_exe

SIZES = [0, 1, 125, 126, 65535, 65536, 300_000]
WAIT = wait(10.0)


def ping_msgs() -> list[bytes]:
    return [p.encode([[p.PING, b"x" * n]]) for n in SIZES]


def pongs_of(frames: list[bytes]) -> list[Any]:
    return [m[1] for f in frames for m in p.decode(f) if m[0] == p.PONG]


# -- the node's server end, other libraries' clients -------------------------------------

@pytest.fixture(scope="module")
def node():
    proc = NodeProcess(env=FAST).start()
    yield proc
    assert proc.stop() == 0, list(proc.lines)[-20:]


async def test_websockets_client_to_the_node(node):
    async with websockets.asyncio.client.connect(node.url, compression=None,
                                                 max_size=None) as ws:
        await ws.send(p.encode([[p.AUTH, {}]]))
        # logged in first: the node prices what comes before (limits.max_bytes_before_auth)
        assert p.decode(await asyncio.wait_for(ws.recv(), WAIT))[0][0] == p.AUTH_OK
        for m in ping_msgs():
            await ws.send(m)
        got: list[bytes] = []
        while len(pongs_of(got)) < len(SIZES):
            got.append(await asyncio.wait_for(ws.recv(), WAIT))
        assert pongs_of(got) == [b"x" * n for n in SIZES]
        latency = await asyncio.wait_for(await ws.ping(b"are you there"), WAIT)
        assert latency >= 0
    assert ws.close_code == 1000 and ws.protocol.close_rcvd is not None
    assert ws.protocol.close_rcvd.code == 1000     # the node's answer to the close


async def test_aiohttp_client_to_the_node(node):
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(node.url, max_msg_size=0, autoping=True,
                                      heartbeat=None) as ws:
            await ws.send_bytes(p.encode([[p.AUTH, {}]]))
            welcome = await ws.receive(timeout=WAIT)
            assert p.decode(welcome.data)[0][0] == p.AUTH_OK, welcome
            for m in ping_msgs():
                await ws.send_bytes(m)
            got: list[bytes] = []
            while len(pongs_of(got)) < len(SIZES):
                msg = await ws.receive(timeout=WAIT)
                assert msg.type is aiohttp.WSMsgType.BINARY, msg
                got.append(msg.data)
            assert pongs_of(got) == [b"x" * n for n in SIZES]
            await ws.ping(b"hello")
            await ws.send_bytes(p.encode([[p.PING, "after"]]))
            msg = await ws.receive(timeout=WAIT)  # aiohttp eats the pong itself
            assert pongs_of([msg.data]) == ["after"]
            assert await ws.close() is True
            assert ws.close_code == 1000


# -- the SDK's client end, other libraries' servers -------------------------------------

class Echoed(ClientConnection):
    """The SDK's client end, keeping what comes back."""

    max_size = 1 << 20

    def __init__(self) -> None:
        super().__init__()
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def frame_received(self, data: FrameData) -> None:
        self.got.put_nowait(bytes(data))


async def round_trip(url: str) -> Echoed:
    """Every size sent and echoed back whole (raw frames: an echo server does not speak
    msgpack), then our close."""
    conn = await asyncio.wait_for(dial(Echoed, url), WAIT)
    for n in SIZES:
        conn.transport.write(frame(0x2, bytes([n % 251]) * n, masked=True))
    for n in SIZES:
        assert await asyncio.wait_for(conn.got.get(), WAIT) == bytes([n % 251]) * n
    return conn


async def test_our_client_end_to_a_websockets_server():
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[int | None] = loop.create_future()
    pinged: asyncio.Future[int] = loop.create_future()

    async def pings(ws: websockets.asyncio.server.ServerConnection) -> None:
        for _ in range(3):  # each waits for our end's pong
            await asyncio.wait_for(await ws.ping(), WAIT)
        pinged.set_result(3)

    async def echo(ws: websockets.asyncio.server.ServerConnection) -> None:
        task = asyncio.create_task(pings(ws))
        async for message in ws:
            await ws.send(message)
        await task
        closed.set_result(ws.close_code)

    async with websockets.asyncio.server.serve(echo, "127.0.0.1", 0, compression=None,
                                               max_size=None, ping_interval=None) as server:
        port = server.sockets[0].getsockname()[1]
        conn = await round_trip(f"ws://127.0.0.1:{port}/")
        assert await asyncio.wait_for(pinged, WAIT) == 3
        await conn.close()
        assert await asyncio.wait_for(closed, WAIT) == 1000
        assert conn.close_code == 1000


async def test_our_client_end_to_an_aiohttp_server():
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[int | None] = loop.create_future()
    ponged: asyncio.Future[bytes] = loop.create_future()

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0, autoping=False)  # pongs come to us
        await ws.prepare(request)
        await ws.ping(b"from aiohttp")
        async for msg in ws:
            if msg.type is aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
            elif msg.type is aiohttp.WSMsgType.PONG and not ponged.done():
                ponged.set_result(msg.data)
            elif msg.type is aiohttp.WSMsgType.CLOSE:
                await ws.close()
        closed.set_result(ws.close_code)
        return ws

    app = web.Application()
    app.router.add_get("/", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        conn = await round_trip(f"ws://127.0.0.1:{port}/")
        assert await asyncio.wait_for(ponged, WAIT) == b"from aiohttp"
        await conn.close()
        assert await asyncio.wait_for(closed, WAIT) == 1000
        assert conn.close_code == 1000
    finally:
        await runner.cleanup()


WS_ECHO = """
import { WebSocketServer } from 'ws'
const server = new WebSocketServer({ host: '127.0.0.1', port: 0, maxPayload: 0 })
server.on('listening', () => console.log(JSON.stringify({ port: server.address().port })))
server.on('connection', (ws) => {
  let pongs = 0
  ws.ping('from ws')
  ws.on('pong', (data) => {
    pongs += 1
    console.log(JSON.stringify({ pong: data.toString() }))
  })
  ws.on('message', (data, binary) => ws.send(data, { binary }))
  ws.on('close', (code) => {
    console.log(JSON.stringify({ closed: code, pongs }))
  })
})
"""


async def lines(proc: asyncio.subprocess.Process) -> AsyncIterator[dict[str, Any]]:
    assert proc.stdout is not None
    while line := await asyncio.wait_for(proc.stdout.readline(), WAIT):
        yield json.loads(line)


async def test_our_client_end_to_a_node_ws_server():
    exe = node_exe()
    proc = await asyncio.create_subprocess_exec(
        exe, "--input-type=module", "-e", WS_ECHO, cwd=JS,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = lines(proc)
        port = (await anext(said))["port"]
        conn = await round_trip(f"ws://127.0.0.1:{port}/")
        assert await anext(said) == {"pong": "from ws"}
        await conn.close()
        assert await anext(said) == {"closed": 1000, "pongs": 1}
        assert conn.close_code == 1000
    finally:
        proc.kill()
        await proc.wait()

