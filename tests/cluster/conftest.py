"""Real redis-server and real node processes on free loopback ports."""

import json
import urllib.request

import pytest

from rpcbus.broker.local import LocalCluster

# Heartbeats every 0.25 s (dead after 3 misses = 0.75 s) and a 0.5 s ack timeout keep
# failover tests short but leave room for a busy 2-core machine running 3 nodes, Redis
# and the test; the tests state where they rely on these values.
FAST = {
    "RPCBUS_RPC_ACK_TIMEOUT": "0.5",
    "RPCBUS_RPC_RESPONSE_TIMEOUT": "5.0",
    "RPCBUS_CLUSTER_HEARTBEAT_INTERVAL": "0.25",
    "RPCBUS_CLUSTER_HEARTBEAT_MISSES": "3",
    "RPCBUS_SERVER_DRAIN_TIMEOUT": "5.0",
}


@pytest.fixture(scope="module")
def cluster3():
    """Three nodes n1..n3 on one embedded Redis, shared by a test module."""
    c = LocalCluster(nodes=3, env=FAST).start()
    yield c
    codes = c.stop()
    assert all(code == 0 for code in codes.values()), codes


@pytest.fixture
def make_cluster():
    """Clusters a test may break (kill nodes, stop Redis); all stopped afterwards."""
    made = []

    def make(nodes=2, node_env=None, **env):
        c = LocalCluster(nodes=nodes, env={**FAST, **env}, node_env=node_env).start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def stats(node):
    with urllib.request.urlopen(node.url.replace("ws://", "http://") + "/stats", timeout=5) as r:
        return json.load(r)
