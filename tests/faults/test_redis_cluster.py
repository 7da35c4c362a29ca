"""Faults of a Redis Cluster bus under load (see harness.py for the checks every scenario
makes: one outcome per call, documented codes, none later than deadline + grace, none
run twice, every call succeeds again within the stated bound).

The shard owning n1's private topic is the one hurt. The only provider is on n1, so the
calls of n2's callers (half the load) all cross: n2 publishes them to n1's topic, n1
receives them there.
"""

import asyncio

from ..timing import wait
from .harness import run

TOPIC = "rpcbus:node:n1"


async def test_the_master_of_a_busy_nodes_topic_killed_and_its_replica_taking_over(scenario):
    sc = scenario(redis_shards=3, redis_replicas=1)
    redis = sc.cluster.redis_cluster

    async def fault(sc):
        old = redis.master_of(TOPIC)
        old.kill()
        # its replica takes over once the others agree it failed (cluster-node-timeout 1 s
        # and an election): the fault lasts until every live server sees the new master
        async with asyncio.timeout(wait(20)):
            while not await asyncio.to_thread(_taken_over, redis, old):
                await asyncio.sleep(0.1)  # redis-servers in child processes: poll them
        sc.cleared()

    # The bus's backoff (at most 5 s) decides when the nodes try again after the
    # takeover; then they read the new slot map, subscribe there and announce themselves.
    await run(sc, fault, recover_within=6.0, in_process_provider_on=(0,))


async def test_a_reshard_of_a_busy_nodes_topic_slot(scenario):
    sc = scenario(redis_shards=3)
    redis = sc.cluster.redis_cluster
    moved_to = []

    async def fault(sc):
        source = redis.master_of(TOPIC)
        target = next(s for s in redis.servers if s is not source)  # all are masters
        await asyncio.to_thread(redis.move_slot, TOPIC, target)
        moved_to.append(target)
        sc.cleared()

    await run(sc, fault, recover_within=6.0, in_process_provider_on=(0,))
    # n1 subscribed again where the slot now lives, and only there
    assert [redis.command(s, "PUBSUB", "SHARDNUMSUB", TOPIC)[1] for s in redis.servers] == [
        1 if s is moved_to[0] else 0 for s in redis.servers]


def _taken_over(redis, old):
    """Every live server sees every slot served, and ``TOPIC``'s by another master."""
    try:
        if redis.master_of(TOPIC) is old:
            return False
        return all(b"cluster_state:ok" in redis.command(s, "CLUSTER", "INFO")
                   for s in redis.servers if s is not old)
    except ConnectionError:  # redis-py's: a server busy electing; ask again
        return False
