"""Real node processes on free loopback ports, real WebSocket clients."""

import json
import urllib.request

import pytest

from rpcbus.broker.process import NodeProcess

# Short timeouts keep failover tests quick; the values are stated where tests rely on them.
FAST = {
    "RPCBUS_RPC_ACK_TIMEOUT": "0.3",
    "RPCBUS_RPC_RESPONSE_TIMEOUT": "2.0",
    "RPCBUS_SERVER_DRAIN_TIMEOUT": "5.0",
}


@pytest.fixture(scope="module")
def node():
    """One node for a test module; it must shut down cleanly (exit 0) at the end."""
    proc = NodeProcess(env=FAST).start()
    yield proc
    assert proc.stop() == 0, list(proc.lines)[-20:]
    assert not proc.events("frame_handling_failed"), "a frame handler raised (a bug)"


@pytest.fixture
def start_node():
    """Start nodes with extra env settings; all are stopped after the test."""
    started = []

    def start(**env):
        proc = NodeProcess(env={**FAST, **env}).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def stats(proc):
    """The node's /stats counters."""
    http = proc.url.replace("ws://", "http://")
    with urllib.request.urlopen(f"{http}/stats", timeout=5) as r:
        return json.load(r)
