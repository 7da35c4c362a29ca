"""Faults beyond the first seven: restarts under the same name, a node that cannot hear,
clock skew, providers closing mid-call, oversized data, the only provider's node paused,
a slow Redis link, connection resets. Each keeps the ledger of harness.py: one outcome
per call, its own data or a documented code, none late, none run twice, bounded recovery.
"""

import asyncio
import json
import re
import signal
import urllib.error
import urllib.request
from collections import Counter

import pytest

import rpcbus
from rpcbus.cluster.seal import Sealer, new_key
from rpcbus.cluster.status import collect, render

from ..timing import wait
from .harness import run

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def counting(sc, pause=0.1):
    """An async handler that counts a run when it starts (a started handler has run, as far
    as side effects go), then takes ``pause`` seconds."""
    async def handler(data):
        sc.runs[tuple(data)] += 1
        await asyncio.sleep(pause)
        return data
    return handler


async def test_two_nodes_restarted_under_their_names_hand_nobody_another_calls_answer(scenario):
    sc = scenario(nodes=3)

    async def fault(sc):
        # SIGKILL n1 and n2 and start them again at once, as a supervisor would, while
        # n3 runs calls they sent and waits for answers from calls it sent them
        await asyncio.gather(asyncio.to_thread(sc.cluster.restart, 0),
                             asyncio.to_thread(sc.cluster.restart, 1))
        sc.cleared()

    # clients stay with their node, so the new n1 and n2 make calls at once (with attempt
    # ids their old processes used too) while n3 still runs calls of the old ones. The
    # handler's 1.5 s holds every call of the first round in flight at the restart, puts a
    # round's start past recover_within, and leaves 1.5 s of the 3 s deadline for the
    # path: at 2.5 s, a round of 300 calls sent at once on a busy host queued past the
    # 0.5 s left (OVERLOADED, RESPONSE_TIMEOUT)
    figures = await run(sc, fault, recover_within=2.5, in_process_provider_on=(0, 1, 2),
                        handler=counting(sc, 1.5), pinned=True)
    assert figures["outcomes"].get("PROVIDER_GONE", 0) + figures["outcomes"].get(
        "CONNECTION_LOST", 0) > 0   # the restart did cut calls


async def test_a_node_that_can_publish_but_not_hear_runs_nothing_twice(scenario):
    sc = scenario(proxied=0)

    async def fault(sc):
        for _ in range(2):                  # twice: each time has its own timing
            sc.proxy.blackhole(True)        # Redis -> n1 swallowed; n1 -> Redis flows
            await asyncio.sleep(3.0)
            sc.proxy.blackhole(False)
            await asyncio.sleep(1.0)
        sc.cleared()

    # n1's reconnects fail while it cannot hear (each waits 2 s for a PING), so its backoff
    # has grown: up to 5 s, then a connect
    await run(sc, fault, recover_within=8.0, handler=counting(sc, 0.0))


def readyz(node):
    try:
        with urllib.request.urlopen(node.url.replace("ws://", "http://") + "/readyz",
                                    timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_a_node_whose_clock_is_off_by_the_allowed_skew_runs_nothing_twice(
        scenario, tmp_path):
    key = new_key()
    offset = tmp_path / "faketime"
    offset.write_text("+0s\n")
    # n1's wall clock is what this file says (re-read every second); its monotonic clock
    # stays true (the loop's timers). 30 s against max_skew 30 s: the others still take
    # n1's batches (they arrive a little later than stamped), n1 refuses theirs.
    faked = {"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(offset),
             "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    sc = scenario(node_env=[faked, {}], RPCBUS_CLUSTER_SEAL="sign",
                  RPCBUS_CLUSTER_KEY_ID="k1", RPCBUS_CLUSTER_KEYS=json.dumps({"k1": key}),
                  RPCBUS_CLUSTER_MAX_SKEW="30")
    seen = {}

    async def fault(sc):
        offset.write_text("+30s\n")
        async with asyncio.timeout(wait(10)):
            while "clock skew" not in (got := readyz(sc.nodes[0]))[1]:
                await asyncio.sleep(0.1)
        seen["readyz"] = got
        seen["status"] = await collect(sc.cluster.redis_url, "rpcbus", 1.5,
                                       Sealer("sign", {"k1": key}, "k1", 30.0))
        offset.write_text("+0s\n")
        sc.cleared()

    await run(sc, fault, recover_within=4.0, handler=counting(sc, 0.0))
    assert seen["readyz"][0] == 503 and "sync the clocks" in seen["readyz"][1]
    assert 29 < seen["status"]["n1"]["clock_offset_s"] < 31
    assert abs(seen["status"]["n2"]["clock_offset_s"]) < 1
    assert re.search(r"n1: its clock is \+(29|30)\.\d s off", render(seen["status"]))
    assert "n2: its clock" not in render(seen["status"])
    assert readyz(sc.nodes[0]) == (200, "ready\n")


async def test_providers_closing_mid_call_never_have_a_call_run_twice(scenario):
    sc = scenario()
    handler = counting(sc, 0.1)

    async def fault(sc):
        for _ in range(8):                  # provider churn: each closes with calls running
            churn = [await sc.provider(0, handler), await sc.provider(1, handler)]
            await asyncio.sleep(0.25)
            for c in churn:
                await c.close()
        sc.cleared()

    figures = await run(sc, fault, recover_within=1.0, handler=handler)
    assert figures["outcomes"].get("PROVIDER_GONE", 0) > 0   # closes did cut running calls


async def test_oversized_calls_and_answers_fail_alone_and_run_once(scenario):
    sc = scenario()
    big = "x" * (4 << 20)
    ran = Counter()

    def answer(data):
        ran[data if isinstance(data, (int, str)) and len(str(data)) < 10 else "?"] += 1
        return big if data == "big" else data

    providers = [await sc.provider(0, answer, "sized"), await sc.provider(0, answer, "sized")]
    caller = await rpcbus.connect(sc.urls[1])            # on n2: the calls cross the bus
    try:
        normal = [asyncio.create_task(caller.call("sized", i, timeout=5)) for i in range(50)]
        with pytest.raises(rpcbus.errors.PayloadTooLargeError, match="nothing was sent"):
            await caller.call("sized", big, timeout=5)
        with pytest.raises(rpcbus.errors.PayloadTooLargeError, match="answer"):
            await caller.call("sized", "big", timeout=5)
        assert await asyncio.gather(*normal) == list(range(50))   # same connection: unhurt
        assert ran["big"] == 1 and ran["?"] == 0                  # ran once, never moved
        assert [await caller.call("sized", i, timeout=5) for i in range(10)] == list(range(10))
        assert not caller.closed and all(not p.closed for p in providers)
        assert {p.url for p in providers} == {sc.urls[0]}        # no provider reconnected
    finally:
        for c in [caller, *providers]:
            await c.close()


async def test_the_only_providers_node_paused_is_called_again_at_once(scenario):
    sc = scenario()

    async def fault(sc):
        sc.nodes[0].signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)            # declared dead by n2 meanwhile
        sc.nodes[0].signal(signal.SIGCONT)
        sc.cleared()

    await run(sc, fault, recover_within=2.5, in_process_provider_on=(0,))


async def test_latency_on_a_nodes_redis_link_never_makes_a_live_provider_absent(scenario):
    sc = scenario(proxied=1, RPCBUS_CLUSTER_HEARTBEAT_INTERVAL="1.0",
                  RPCBUS_CLUSTER_PROVIDER_CACHE_TTL="0.5")   # n2 asks again and again

    async def fault(sc):
        sc.proxy.delay(0.3)                 # each way, on n2's link
        await asyncio.sleep(4.0)
        sc.proxy.delay(0.0)
        sc.cleared()

    figures = await run(sc, fault, recover_within=2.0, in_process_provider_on=(0,))
    assert "NO_PROVIDER" not in figures["outcomes"], (figures["outcomes"], figures["said"])


async def test_answers_of_calls_that_ran_outlive_resets_of_the_serving_nodes_link(scenario):
    sc = scenario(proxied=0)

    async def fault(sc):
        for _ in range(4):
            sc.proxy.reset()                # n1's bus drops and reconnects
            await asyncio.sleep(0.5)
        sc.cleared()

    figures = await run(sc, fault, recover_within=2.5, in_process_provider_on=(0,),
                        handler=counting(sc, 0.2))
    assert "RESPONSE_TIMEOUT" not in figures["outcomes"], (figures["outcomes"], figures["said"])
