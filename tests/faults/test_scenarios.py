"""Fault injection under load (see harness.py for the checks every scenario makes).

Each scenario states how long after the fault clears every call must succeed again.
"""

import asyncio
import signal

from rpcbus.broker.process import NodeProcess

from .harness import ENV, run


async def test_provider_process_killed(scenario):
    sc = scenario()
    proc = sc.provider_process(0)

    async def fault(sc):
        proc.kill()
        sc.crashed()
        sc.cleared()

    await run(sc, fault, recover_within=1.0, in_process_provider_on=(1,))


async def test_node_killed(scenario):
    sc = scenario()

    async def fault(sc):
        sc.nodes[0].kill()
        sc.crashed()
        sc.killed.add(sc.nodes[0].name)
        sc.cleared()

    await run(sc, fault, recover_within=2.5)        # 3 heartbeats (0.75 s) + reconnecting


async def test_node_paused_longer_than_the_heartbeat_timeout(scenario):
    sc = scenario()

    async def fault(sc):
        sc.nodes[0].signal(signal.SIGSTOP)
        await asyncio.sleep(2.0)                     # the fault's length: > 0.75 s
        sc.nodes[0].signal(signal.SIGCONT)
        sc.cleared()

    await run(sc, fault, recover_within=2.5)


async def test_redis_killed_and_restarted(scenario):
    sc = scenario()

    async def fault(sc):
        sc.cluster.redis.kill()
        await asyncio.sleep(2.0)                     # the fault's length
        await asyncio.to_thread(sc.cluster.redis.start)
        sc.cleared()

    await run(sc, fault, recover_within=6.0)        # the bus's backoff reaches 5 s


async def test_redis_paused(scenario):
    sc = scenario()

    async def fault(sc):
        sc.cluster.redis.pause()
        # Replies of calls that ran just before are held up: their origin's ack timeout
        # re-routes them (the rule), so these may run twice, as after a crash.
        sc.crashed()
        await asyncio.sleep(3.0)                     # the fault's length
        sc.cluster.redis.resume()
        sc.cleared()

    await run(sc, fault, recover_within=6.0)


async def test_providers_that_never_answer_or_answer_slowly(scenario):
    sc = scenario()

    # A run counts when the handler completes: one cancelled by the node's CANCEL
    # (after the ack timeout, when this overloaded test process accepted too late)
    # did not produce a result.
    async def stuck(data):
        await asyncio.Event().wait()                 # accepts, never answers

    async def slow(data):
        await asyncio.sleep(0.5)
        sc.runs[tuple(data)] += 1
        return data

    async def fault(sc):
        bad = [await sc.provider(0, stuck), await sc.provider(1, slow)]
        await asyncio.sleep(2.0)                     # the fault's length
        for c in bad:
            await c.close()
        sc.cleared()

    await run(sc, fault, recover_within=1.0)


async def test_every_client_of_a_node_disconnected_at_once(scenario):
    sc = scenario()

    async def fault(sc):
        old = sc.nodes[0]
        port = old.url.rsplit(":", 1)[1]
        old.kill()                                   # every connection to n1 drops at once
        sc.crashed()
        new = NodeProcess("--name", "n1", "--port", port, "--redis", sc.cluster.redis_url,
                          env=ENV)
        await asyncio.to_thread(new.start)           # the same node comes back: clients return
        sc.nodes[0] = sc.cluster.nodes[0] = new
        sc.cleared()

    await run(sc, fault, recover_within=2.5)
