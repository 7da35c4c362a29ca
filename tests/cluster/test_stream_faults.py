"""A stream whose provider process is killed mid-stream (SIGKILL, across two node
processes): the parts already sent arrive in order, then PROVIDER_GONE."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

import rpcbus


async def test_a_provider_killed_mid_stream_ends_it_provider_gone_after_its_parts(
        make_cluster):
    cluster = make_cluster(nodes=2)
    provider = subprocess.Popen(   # serves bench.echo.parts: its data, again and again
        [sys.executable, "-m", "rpcbus.benchmarks.workers", "provider", "--url",
         cluster.nodes[0].url, "--rpc", "bench.echo"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert provider.stdout is not None
        assert json.loads(provider.stdout.readline()) == {"ready": True}
        async with rpcbus.connect(cluster.nodes[1].url) as caller:
            got = 0
            with pytest.raises(rpcbus.ProviderGoneError):
                async for part in caller.stream("bench.echo.parts", got, timeout=30,
                                                window=4):
                    assert part == 0          # its own data, every part
                    got += 1
                    if got == 50:
                        provider.send_signal(signal.SIGKILL)
            assert got >= 50
    finally:
        provider.kill()
        provider.wait()
        provider.stdout.close()  # else its pipe is left to a later test's garbage collection
