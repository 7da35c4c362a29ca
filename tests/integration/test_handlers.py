"""Handlers as users write them never make a call run twice (one node process, provider
processes that record every run, callers here; the node's ack timeout is 0.3 s).

A handler slower than the ack timeout used to hold the provider's event loop, so no
ACCEPT left in time, the node moved the call on and a second provider ran it too. Now a
plain function runs in a worker thread, every call's ACCEPT leaves before its handler
starts, and a REQUEST read after its ack deadline is refused unrun.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import pytest

import rpcbus

from ..timing import wait
from .conftest import stats


class Provider:
    """``python -m rpcbus.benchmarks.workers provider`` recording its runs in a file."""

    def __init__(self, url: str, record: str, handler: str, work: float) -> None:
        self.record = record
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rpcbus.benchmarks.workers", "provider", "--url", url,
             "--rpc", "job", "--record", record, "--handler", handler, "--work", str(work)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def runs(self) -> Counter[int]:
        with open(self.record) as f:
            return Counter(run for run in map(json.loads, filter(str.strip, f))
                           if not isinstance(run, dict))  # not {"cancelled": ...}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


async def _calls(url: str, n: int, timeout: float) -> list[object]:
    async with rpcbus.connect(url) as c:
        async def one(i: int) -> object:
            try:
                return await c.call("job", i, timeout=timeout)
            except rpcbus.RpcError as exc:
                return exc.code
        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.mark.parametrize("kinds, work, calls, timeout", [
    # two providers whose plain functions block 0.7 s (over twice the ack timeout):
    # every call answered, none run twice (before: NO_PROVIDER for all, each run twice)
    (("def", "def"), 0.7, 8, 10.0),
    # one blocking and one fast provider (before: some calls ran on both)
    (("def", "async"), 0.7, 60, 10.0),
    # an async handler that holds the loop (CPU-bound) 0.4 s: its calls are answered late,
    # REQUESTs read behind it are refused unrun and go to the other provider
    (("spin", "async"), 0.4, 40, 15.0),
])
async def test_slow_handlers_never_run_a_call_twice(start_node, tmp_path, kinds, work, calls,
                                                    timeout):
    node = start_node()
    providers = [Provider(node.url, str(tmp_path / f"p{i}.log"), kind,
                          work if kind != "async" else 0.0)
                 for i, kind in enumerate(kinds)]
    try:
        results = await _calls(node.url, calls, timeout)
        runs: Counter[int] = Counter()
        for p in providers:
            runs.update(p.runs())
    finally:
        for p in providers:
            p.stop()
    assert results == list(range(calls)), Counter(r for r in results if not isinstance(r, int))
    assert [i for i, n in runs.items() if n > 1] == []
    assert sorted(runs) == list(range(calls))
    assert stats(node)["router"]["late"] == 0  # no answer came for an attempt moved on


async def test_calls_held_on_their_way_to_the_node_start_no_handler_late(node):
    """A caller's frames held 1.5 s on the way to the node (a congested link, a full
    socket buffer): its calls of 1 s reach the node after their caller stopped waiting.
    The node takes the time a frame waited (its SENT) off its calls' time left: it
    answers them RESPONSE_TIMEOUT, unrun, and no handler starts for nobody. Before,
    each started ~0.5 s after its caller had given up."""
    from ..faults.proxy import Proxy

    started: list[float] = []                         # how late past its caller's deadline

    async def job(data):
        started.append(time.monotonic() - data["deadline"])
        return data["i"]

    proxy = Proxy(int(node.url.rsplit(":", 1)[1])).start()
    try:
        async with rpcbus.connect(node.url) as provider, \
                rpcbus.connect(f"ws://127.0.0.1:{proxy.port}") as caller:
            await provider.provide("held.job", job)
            for i in range(20):                       # the connection's usual delay, learnt
                assert await caller.call("held.job", {"i": i, "deadline": 1e12}) == i
            before = stats(node)["router"]["response_timeouts"]
            started.clear()
            proxy.delay(wait(1.5))
            calls = [asyncio.ensure_future(caller.call(
                "held.job", {"i": i, "deadline": time.monotonic() + 1.0}, timeout=1.0))
                for i in range(20)]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert all(isinstance(o, rpcbus.errors.ResponseTimeoutError) for o in outcomes)
            async with asyncio.timeout(wait(10)):       # the held frames reach the node
                while stats(node)["router"]["response_timeouts"] + len(started) < before + 20:
                    await asyncio.sleep(0.05)
            assert started == [], f"{len(started)} started, up to {max(started):.2f} s late"
            proxy.delay(0)
            assert await caller.call("held.job", {"i": 7, "deadline": 1e12}) == 7
    finally:
        proxy.stop()
