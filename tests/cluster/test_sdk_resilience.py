"""The SDK survives node loss: reconnects to another URL, provides again, resends only
idempotent calls, reports its state; and follows a node that shuts down."""

import asyncio
import signal

import pytest

import rpcbus

from ..timing import wait


class States:
    """An ``on_state`` callback that tests can await."""

    def __init__(self):
        self.seen = []
        self._changed = asyncio.Event()

    def __call__(self, state):
        self.seen.append(state)
        self._changed.set()

    async def reached(self, *sequence, timeout=10.0):
        async with asyncio.timeout(timeout):
            while self.seen[:len(sequence)] != list(sequence):
                self._changed.clear()
                await self._changed.wait()


async def test_reconnect_to_another_node_provides_again_and_resends_idempotent_calls(
        make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    states, caller_states = States(), States()
    runs = []
    hold, both_held = asyncio.Event(), asyncio.Event()

    async def work(d):
        runs.append(d)
        if d == "held":
            if runs.count("held") == 2:
                both_held.set()
            await hold.wait()
        return d

    async with rpcbus.connect([n1.url, n2.url], on_state=states) as prov, \
            rpcbus.connect([n1.url, n2.url], on_state=caller_states) as caller, \
            rpcbus.connect(n2.url) as other:
        assert prov.url == n1.url and caller.url == n1.url
        await prov.provide("work", work)
        plain = asyncio.create_task(caller.call("work", "held", timeout=20))
        again = asyncio.create_task(caller.call("work", "held", timeout=20, idempotent=True))
        async with asyncio.timeout(wait(5)):
            await both_held.wait()                       # both calls reached the handler
        n1.kill()                                        # both clients lose their node
        with pytest.raises(rpcbus.ConnectionLostError):
            await plain                                  # sent, not idempotent: fails at once
        for log in (states, caller_states):
            await log.reached("connected", "reconnecting", "connected")
        assert prov.url == n2.url and caller.url == n2.url
        hold.set()
        assert await again == "held"                     # sent again on the new connection
        assert await other.call("work", "x", timeout=5) == "x"   # provided again on n2
    assert states.seen == ["connected", "reconnecting", "connected", "closed"]


async def test_a_node_shutting_down_sends_its_clients_elsewhere(make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(d):
        started.set()
        await release.wait()
        return d

    prov_states, caller_states = States(), States()
    async with rpcbus.connect([n1.url, n2.url], on_state=prov_states) as prov, \
            rpcbus.connect([n1.url, n2.url], on_state=caller_states) as caller:
        await prov.provide("slow", slow)
        in_flight = asyncio.create_task(caller.call("slow", "before", timeout=20))
        await started.wait()
        n1.signal(signal.SIGTERM)
        for log in (prov_states, caller_states):          # both move while n1 drains
            await log.reached("connected", "reconnecting", "connected")
        assert prov.url == n2.url and caller.url == n2.url
        release.set()
        assert await in_flight == "before"               # finished on the draining node
        assert await caller.call("slow", "after", timeout=10) == "after"   # now via n2
        assert await asyncio.to_thread(n1.wait_exit, 20) == 0


async def test_a_call_refused_by_a_draining_node_is_sent_to_another_node(make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    release, started = asyncio.Event(), asyncio.Event()

    async def held(d):
        started.set()
        await release.wait()
        return d

    async with rpcbus.connect(n1.url) as p1, rpcbus.connect(n2.url) as p2, \
            rpcbus.connect([n1.url, n2.url]) as caller:
        await p1.provide("held", held)                   # keeps n1 draining
        await p2.provide("work", lambda d: d * 2)
        in_flight = asyncio.create_task(caller.call("held", "x", timeout=20))
        await started.wait()
        assert caller.url == n1.url
        n1.signal(signal.SIGTERM)
        # Block this loop until n1 drains, so the caller has not yet read n1's notice:
        # the next call goes to n1 (draining) and is refused with SHUTTING_DOWN.
        n1.wait_event("node_draining", 10.0)
        assert await caller.call("work", 21, timeout=10) == 42   # sent again, via n2
        assert caller.url == n2.url
        release.set()
        assert await in_flight == "x"
        assert await asyncio.to_thread(n1.wait_exit, 20) == 0


async def test_a_call_that_waited_for_a_connection_goes_out_with_the_time_it_has_left(
        make_cluster):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    seen = []
    states = States()

    def work(d, ctx):
        seen.append(ctx.time_left)
        return d

    async with rpcbus.connect(n2.url) as prov, \
            rpcbus.connect(n1.url, on_state=states) as caller:
        await prov.provide("work", work)
        n1.kill()                                        # the caller waits for its node
        await states.reached("connected", "reconnecting")
        call = asyncio.create_task(caller.call("work", "late", timeout=8.0))
        await asyncio.sleep(wait(1.5))                   # the call waits, unsent
        await asyncio.to_thread(c.restart, 0)            # the node comes back on its port
        assert await call == "late"                      # (the SDK's backoff: a few s)
    assert len(seen) == 1 and seen[0] <= 6.5             # not its full 8 s again
