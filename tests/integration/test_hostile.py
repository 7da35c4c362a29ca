"""Hostile input gets clear errors; the node keeps serving a healthy client throughout."""

import asyncio
import os
import random

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed

import clients
from clients import protocol as p

from .conftest import stats
from .raw import RawPeer


@pytest.fixture
async def healthy(node):
    """A provider and a caller calling all the time; yields a check of their results."""
    async with clients.connect(node.url) as prov, clients.connect(node.url) as caller:
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
            async with asyncio.timeout(10):
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
    ([p.CANCEL, 3], 3, "CANCEL is not sent by clients"),
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
