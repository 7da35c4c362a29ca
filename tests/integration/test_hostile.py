"""Hostile input gets clear errors; the node keeps serving a healthy client throughout."""

import asyncio
import os
import random

import msgpack
import psutil
import pytest
from websockets.exceptions import ConnectionClosed

import rpcbus
from rpcbus import protocol as p

from ..timing import wait
from .conftest import stats
from .raw import RawPeer


@pytest.fixture
async def healthy(node):
    """A provider and a caller calling all the time; yields a check of their results."""
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("echo", lambda d: d)
        results = []
        stop = asyncio.Event()
        progress = asyncio.Event()

        async def keep_calling():
            i = 0
            while not stop.is_set():
                i += 1
                results.append((i, await caller.call("echo", i, timeout=5)))
                progress.set()

        task = asyncio.create_task(keep_calling())

        async def check():
            """20 more correct answers after the hostile part, and none wrong at any time."""
            mark = len(results)
            async with asyncio.timeout(wait(10)):
                while len(results) < mark + 20:
                    progress.clear()
                    await progress.wait()
            stop.set()
            await task
            assert all(i == r for i, r in results)

        yield check


async def test_random_bytes_are_answered_with_invalid_message(node, healthy):
    rng = random.Random(7)
    peer = await RawPeer.open(node.url)
    for _ in range(5):
        await peer.send_raw(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))))
        err = await peer.expect(p.ERROR)
        assert err[2] == "INVALID_MESSAGE"
    await peer.send([p.PING, "still here"])
    assert (await peer.expect(p.PONG))[1] == "still here"
    await peer.close()
    await healthy()


@pytest.mark.parametrize("msg, ref, why", [
    ([p.REQUEST, 5, 12, None, None], 5, "name must be a string"),
    ([p.REQUEST, 6, "echo", None, "soon"], 6, "timeout_ms"),
    ([p.REQUEST, "x", "echo", None, None], None, "cid must be an unsigned integer"),
    ([p.PROVIDE, 7, ["has space"]], 7, "invalid rpc name"),
    ([p.PROVIDE, 8, "echo"], 8, "names must be a non-empty array"),
    ([77, 9], 9, "unknown message kind 77"),
    ([p.CANCEL, 3, "x"], 3, "CANCEL takes"),
    ([p.AUTH_OK, 4], 4, "AUTH_OK is not sent by clients"),
    ([p.AUTH, {}], None, "already authenticated"),
])
async def test_wrong_fields_are_named_and_answered_with_the_ref(node, healthy, msg, ref, why):
    peer = await RawPeer.open(node.url)
    await peer.send(msg)
    err = await peer.expect(p.ERROR)
    assert err[1] == ref and err[2] == "INVALID_MESSAGE" and why in err[3]
    await peer.close()
    await healthy()


async def test_text_frames_and_messages_before_auth_are_refused(node, healthy):
    peer = await RawPeer.open(node.url, auth=False)
    await peer.send([p.REQUEST, 1, "echo", 1, None])
    err = await peer.expect(p.ERROR)
    assert err[1:3] == [1, "NOT_AUTHENTICATED"]
    await peer.ws.send("{\"json\": true}")
    err = await peer.expect(p.ERROR)
    assert err[2] == "INVALID_MESSAGE" and "text frames" in err[3]
    await peer.close()
    await healthy()


async def test_oversized_frame_closes_that_connection_only(node, healthy):
    peer = await RawPeer.open(node.url)
    await peer.send_raw(msgpack.packb([p.REQUEST, 1, "echo", os.urandom(2 << 20), None]))
    with pytest.raises(ConnectionClosed) as closed:
        await peer.recv(timeout=10)
    assert closed.value.rcvd.code == 1009             # message too big
    await healthy()


async def test_a_peer_that_keeps_sending_garbage_is_closed(node, healthy):
    peer = await RawPeer.open(node.url)
    before = stats(node)["io"].get("closed_for_garbage", 0)
    await peer.send(*[[99, i] for i in range(50)])      # 50 invalid messages in one frame
    errors_seen = 0
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            msg = await peer.recv(timeout=10)
            errors_seen += msg[0] == p.ERROR
    assert closed.value.rcvd.code == 1008 and errors_seen == 11   # 10 tolerated, the 11th closes
    assert stats(node)["io"]["closed_for_garbage"] == before + 1
    await healthy()


async def test_answers_for_calls_this_connection_was_never_given_are_ignored(node, healthy):
    intruder = await RawPeer.open(node.url)
    before = stats(node)["router"]
    for attempt in range(1, 200):                      # guess attempt ids of others' calls
        await intruder.send([p.RESPONSE, attempt, "forged"], [p.REJECT, attempt])
    await intruder.send([p.PING, 0])
    await intruder.expect(p.PONG)
    after = stats(node)["router"]
    assert after["late"] + after["foreign"] > before["late"] + before["foreign"]
    await intruder.close()
    await healthy()                                    # no forged answer reached the caller


def _random_object(rng, depth=0):
    """A random msgpack-able value: shapes a message might almost have."""
    pick = rng.random()
    if depth > 3 or pick < 0.5:
        return rng.choice([None, True, -1, 0, 1, 2**63, rng.randint(-5, 40), 1.5,
                           "", "echo", "x" * rng.randint(0, 300), b"\x00\xff",
                           rng.randint(0, 2**32)])
    if pick < 0.85:
        return [_random_object(rng, depth + 1) for _ in range(rng.randint(0, 7))]
    return {_random_object(rng, 4): _random_object(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _mutate(rng, frame):
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        i = rng.randrange(len(data)) if data else 0
        if op < 0.4 and data:
            data[i] ^= 1 << rng.randrange(8)                   # flip a bit
        elif op < 0.6:
            data[i:i] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
        elif op < 0.8 and len(data) > 1:
            del data[i:i + rng.randint(1, 8)]                  # cut
        else:
            data[i:i] = data[: rng.randint(0, len(data))]      # splice a copy in
    return bytes(data)


async def test_fuzzed_frames_from_many_connections_leave_the_node_serving(node, healthy):
    """Mutated valid frames and random msgpack shapes over 60 connections (some never
    authenticated; most are closed for garbage after a few dozen frames): the node answers or
    closes them, keeps serving the healthy
    client correctly, raises nothing, and its memory stays bounded."""
    rng = random.Random(11)
    corpus = [p.encode([m]) for m in (
        [p.AUTH, {"protocol": 1, "name": "fz"}], [p.PROVIDE, 1, ["echo", "a.b"]],
        [p.UNPROVIDE, 2, ["a.b"]], [p.REQUEST, 3, "echo", {"k": [1, 2]}, 500],
        [p.RESPONSE, 4, "x"], [p.ACCEPT, 5], [p.REJECT, 6], [p.ERROR, 7, "E", "m"],
        [p.PING, 8], [p.PONG, 9])] + [p.encode([[p.REQUEST, i, "echo", i, None]
                                                for i in range(20)])]
    rss_before = psutil.Process(node.pid).memory_info().rss
    sent = closed = 0
    for _ in range(60):
        peer = await RawPeer.open(node.url, auth=rng.random() < 0.8)
        try:
            for _ in range(100):
                if rng.random() < 0.7:
                    frame = _mutate(rng, rng.choice(corpus))
                else:
                    frame = msgpack.packb(_random_object(rng))
                await peer.send_raw(frame or b"\xc1")
                sent += 1
            await peer.send([p.PING, "end"])
            await peer.expect(p.PONG, timeout=5)
        except ConnectionClosed:
            closed += 1                                        # closed for garbage: the policy
        finally:
            peer.abort()
    await healthy()
    assert sent >= 1000 and closed and not node.events("frame_handling_failed")
    grown = psutil.Process(node.pid).memory_info().rss - rss_before
    assert grown < 32 << 20, f"RSS grew {grown >> 20} MiB"


async def test_the_sdk_drops_only_the_message_it_cannot_decode():
    """A node (here a hostile stand-in) batches an answer the SDK cannot decode (a map
    keyed by an array) with a good one: only the bad one is lost, and counted."""
    from websockets.asyncio.server import serve

    async def node(ws):
        cids = []
        async for data in ws:
            for msg in p.decode(data):
                if msg[0] == p.AUTH:
                    await ws.send(p.encode([[p.AUTH_OK, {"node": "evil", "session": "s1",
                                                          "protocol": 1}]]))
                elif msg[0] == p.REQUEST:
                    cids.append(msg[1])
            if len(cids) == 2:
                bad = b"\x93" + msgpack.packb(p.RESPONSE) + msgpack.packb(cids[0]) \
                    + b"\x81\x91\x01\x02"                         # {[1]: 2}
                await ws.send(b"\x93" + bad + msgpack.packb([p.RESPONSE, cids[1], "fine"])
                              + msgpack.packb([p.PONG, None]))

    async with serve(node, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with rpcbus.connect(f"ws://127.0.0.1:{port}", reconnect=False) as client:
            first, second = await asyncio.gather(client.call("x", 1, timeout=0.5),
                                                 client.call("y", 2, timeout=3),
                                                 return_exceptions=True)
            assert second == "fine"
            assert isinstance(first, rpcbus.ResponseTimeoutError)  # its answer was lost
            assert client.messages_dropped == 1
