"""Calls across nodes that need node processes: a paused node runs nothing twice (the rest
of cross-node routing runs in process: tests/inproc/test_routing.py)."""

import asyncio
import signal
from collections import Counter

import rpcbus


def served_by(name):
    return lambda data, ctx: {"served_by": name, "data": data}


async def test_a_paused_node_does_not_run_calls_the_cluster_gave_up_on(make_cluster):
    # ack timeout 1 s, dead after 3 x 0.5 s: the 2.5 s pause below outlasts both.
    c = make_cluster(nodes=3, RPCBUS_RPC_ACK_TIMEOUT="1.0",
                     RPCBUS_CLUSTER_HEARTBEAT_INTERVAL="0.5")
    n1, n2, n3 = c.nodes
    runs = Counter()

    def counting(where):
        def handler(data):
            runs[data] += 1
            return where
        return handler

    async with rpcbus.connect(n1.url) as p1, rpcbus.connect(n2.url) as p2, \
            rpcbus.connect(n3.url) as caller:
        await p1.provide("once", counting("n1"))
        await p2.provide("once", counting("n2"))
        await caller.call("once", -1, timeout=5)     # discovery done: both nodes known
        loop = asyncio.get_running_loop()
        n1.signal(signal.SIGSTOP)                    # hung, not dead
        paused = loop.time()
        try:
            got = await asyncio.gather(*(caller.call("once", i, timeout=10) for i in range(100)))
        finally:
            await asyncio.sleep(max(0.0, paused + 2.5 - loop.time()))  # the fault's length
            n1.signal(signal.SIGCONT)
        assert got == ["n2"] * 100                    # re-routed after the ack timeout
        # After it resumes, n1 drops the INVOKEs that waited for it meanwhile.
        await asyncio.to_thread(n1.wait_event, "stale_invoke_dropped", 10.0)
        assert await caller.call("once", 10_000, timeout=5) in ("n1", "n2")
    assert all(runs[i] == 1 for i in range(100)), {i: runs[i] for i in range(100) if runs[i] != 1}
