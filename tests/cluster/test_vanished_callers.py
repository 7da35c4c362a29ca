"""A caller that vanishes (killed, crash-looping) leaves no work behind: its calls in
flight are cancelled at their providers, on its own node or another, within moments
(before: they ran to their deadlines for nobody)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from .conftest import stats

CALLS = 40

_CALLER = r'''
import asyncio, sys
import rpcbus

async def main():
    async with rpcbus.connect(sys.argv[1]) as c:
        await asyncio.gather(*(c.call("slow", i, timeout=60) for i in range(int(sys.argv[2]))))

asyncio.run(main())
'''


def _lines(path) -> list:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


async def _until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("caller_on", [0, 1], ids=["same-node", "other-node"])
async def test_a_killed_callers_calls_are_cancelled_at_their_providers(make_cluster, tmp_path,
                                                                     caller_on):
    cluster = make_cluster(nodes=2)
    record = tmp_path / "runs.log"
    provider = subprocess.Popen(
        [sys.executable, "-m", "rpcbus.benchmarks.workers", "provider", "--url",
         cluster.nodes[0].url, "--rpc", "slow", "--record", str(record), "--work", "30"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    caller = None
    try:
        assert provider.stdout is not None
        assert json.loads(provider.stdout.readline()) == {"ready": True}
        caller = subprocess.Popen([sys.executable, "-c", _CALLER,
                                   cluster.nodes[caller_on].url, str(CALLS)])
        await _until(lambda: len(_lines(record)) >= CALLS, 30, "the calls never all started")
        caller.kill()  # SIGKILL: the caller says nothing, its socket just closes
        caller.wait()
        killed = time.monotonic()
        await _until(lambda: sum(isinstance(r, dict) for r in _lines(record)) >= CALLS, 5,
                     "the provider still runs calls of a caller that is gone")
        took = time.monotonic() - killed
        runs = _lines(record)
        assert sorted(r["cancelled"] for r in runs if isinstance(r, dict)) == list(range(CALLS))
        assert sorted(r for r in runs if not isinstance(r, dict)) == list(range(CALLS))
        assert took < 2.0, f"cancelled {took:.2f} s after the caller died"
        for node in cluster.nodes:
            assert stats(node)["pending"] == 0
        assert stats(cluster.nodes[caller_on])["router"]["cancelled"] == CALLS
    finally:
        for proc in (caller, provider):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        assert provider.stdout is not None
        provider.stdout.close()
