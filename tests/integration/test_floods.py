"""What a connection may send before and beside its messages is bounded and priced:
WebSocket pings and pongs, the upgrade request, the bytes before login, and how many
connections one address may hold open or logging in. Raw sockets play the attacker; a
healthy provider and caller on the same node keep working throughout."""

import asyncio

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed

import rpcbus
from rpcbus import protocol as p
from rpcbus.benchmarks.attacks import handshake, masked

from ..timing import wait
from .conftest import stats
from .raw import RawPeer
from .test_hostile import healthy  # noqa: F401  (a fixture)
from .test_operations import get


async def read_until_closed(reader, timeout=5.0):
    """Everything the node sends until it closes the connection."""
    data = b""
    async with asyncio.timeout(timeout):
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionResetError:  # closed with our bytes unread: the kernel resets
            pass
    return data


async def test_a_ping_flood_before_login_closes_that_connection(node, healthy):  # noqa: F811
    before = stats(node)["io"].get("closed_for_control_frames", 0)
    reader, writer = await handshake(node.url)
    writer.write(masked(0x9, b"") * 20_000)            # 120 kB of pings, never logged in
    data = await read_until_closed(reader)
    assert data.count(b"\x8a\x00") <= 20               # the budget's pongs at most
    assert stats(node)["io"]["closed_for_control_frames"] == before + 1
    writer.transport.abort()
    await healthy()


async def test_pings_and_pongs_after_login_have_a_budget_too(node, healthy):  # noqa: F811
    peer = await RawPeer.open(node.url)
    for _ in range(15):                                # within the budget: answered
        await asyncio.wait_for(await peer.ws.ping(), wait(5))
    unasked = masked(0xA, b"x" * 125)                  # pongs nobody asked for count too
    peer.ws.transport.write(unasked * 10)
    with pytest.raises(ConnectionClosed) as closed:
        await peer.recv(timeout=5)
    assert closed.value.rcvd.code == 1008 and "ping or pong" in closed.value.rcvd.reason
    await healthy()


async def test_pongs_a_client_never_reads_cannot_grow_the_node(node, healthy):  # noqa: F811
    reader, writer = await handshake(node.url)
    ping = masked(0x9, b"x" * 125)
    async with asyncio.timeout(wait(5)):                     # closed: writing fails or EOF
        with pytest.raises(ConnectionError):
            while True:
                writer.write(ping * 64)
                await writer.drain()
                await asyncio.sleep(0.01)
    writer.transport.abort()
    await healthy()


async def test_a_connection_closed_for_a_flood_is_read_no_more(node, healthy):  # noqa: F811
    """Closed for its pings, a peer that goes on sending is not read for the second its
    close takes (it was, and dropped, as fast as it could send: hundreds of MB of the
    node's reading): what it gets through is what the sockets' buffers hold."""
    reader, writer = await handshake(node.url)
    chunk = masked(0x9, b"x" * 125) * 512                  # 64 kB of pings
    sent = 0
    async with asyncio.timeout(wait(10)):                  # aborted after the grace
        try:
            while True:
                writer.write(chunk)
                sent += len(chunk)
                try:
                    await asyncio.wait_for(writer.drain(), 0.01)
                except TimeoutError:
                    pass
                if writer.transport.is_closing():
                    break
        except ConnectionError:
            pass
    taken = sent - writer.transport.get_write_buffer_size()
    writer.transport.abort()
    assert taken < 64 << 20, f"{taken >> 20} MB taken after the close"
    await healthy()


async def test_an_oversized_upgrade_request_is_refused(node, healthy):  # noqa: F811
    lines = [b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(20)]
    with pytest.raises(ConnectionError, match="431"):
        await handshake(node.url, extra=b"".join(lines))         # 20 kB
    reader, writer = await handshake(node.url, extra=b"".join(lines[:8]))  # within limits
    writer.transport.abort()
    assert stats(node)["io"]["handshakes_too_large"] >= 1
    await healthy()


async def test_bytes_before_login_are_bounded(node, healthy):  # noqa: F811
    peer = await RawPeer.open(node.url, auth=False)
    await peer.send_raw(msgpack.packb([p.PING, b"x" * 70_000]))   # over 64 kB, no AUTH yet
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await peer.recv(timeout=5)
    assert closed.value.rcvd.code == 1008 and "before AUTH" in closed.value.rcvd.reason
    logged_in = await RawPeer.open(node.url)                   # after AUTH: the frame limit
    await logged_in.send([p.PING, b"x" * 70_000])
    assert (await logged_in.expect(p.PONG))[0] == p.PONG
    await healthy()


async def test_connections_are_limited_per_address_and_while_logging_in(start_node):
    node = start_node(RPCBUS_LIMITS_MAX_UNAUTHENTICATED_PER_ADDRESS="4",
                      RPCBUS_LIMITS_MAX_CONNECTIONS_PER_ADDRESS="6",
                      RPCBUS_LIMITS_AUTH_TIMEOUT="3")
    waiting = [await handshake(node.url, local="127.0.0.9") for _ in range(4)]
    with pytest.raises(ConnectionError, match="429"):        # a fifth not logged in
        await handshake(node.url, local="127.0.0.9")
    other = await RawPeer.open(node.url)                       # another address: served
    for _, writer in waiting[:2]:                              # two leave: room for two
        writer.transport.abort()
    async with asyncio.timeout(wait(2)):           # 2 waiting, other, and this HTTP request
        while stats(node)["connections"]["open"] > 4:
            await asyncio.sleep(0.02)
    logged_in = [await RawPeer.open(node.url, local_addr=("127.0.0.9", 0)) for _ in range(2)]
    # 2 waiting + 2 logged in from .9; up to 6 open: two more may come, a seventh not
    extra = [await RawPeer.open(node.url, local_addr=("127.0.0.9", 0)) for _ in range(2)]
    with pytest.raises(Exception, match="429"):
        await RawPeer.open(node.url, local_addr=("127.0.0.9", 0))
    # the two that never logged in are closed at the login timeout, handshake or not
    for reader, writer in waiting[2:]:
        await read_until_closed(reader, timeout=8)
        writer.transport.abort()
    s = stats(node)                          # (this HTTP request is a connection too)
    assert s["connections"]["logging_in"] == 1 and s["connections"]["open"] == 6
    assert s["auth"]["connections_refused_429"] == 2
    assert 'rpcbus_connections_refused_total{status="429"} 2.0' in get(node, "/metrics")[1]
    assert (await other.send([p.PING, 1])) is None and (await other.expect(p.PONG))[1] == 1
    for peer in [other, *logged_in, *extra]:
        await peer.close()


async def test_a_burst_of_clients_from_one_address_is_smoothed_not_failed(start_node):
    node = start_node(RPCBUS_LIMITS_MAX_UNAUTHENTICATED_PER_ADDRESS="4")
    clients = await asyncio.gather(*(rpcbus.connect(node.url) for _ in range(40)))
    try:
        assert all(c.state == "connected" for c in clients)
        assert stats(node)["auth"]["connections_refused_429"] > 0   # the limit was met
    finally:
        await asyncio.gather(*(c.close() for c in clients))
