"""A node cut off from the cluster sends its clients elsewhere: they move to another URL
they hold and provide there, so a name provided only on the cut-off node is served again
while the fault lasts (before: its clients stayed, and every call to that name failed
until Redis came back)."""

import asyncio

from .harness import run

EVACUATE_AFTER = 1.5


async def test_clients_of_a_node_cut_off_from_redis_move_and_serve_on(scenario):
    sc = scenario(nodes=3, proxied=0, RPCBUS_CLUSTER_EVACUATE_AFTER=str(EVACUATE_AFTER))

    async def fault(sc):
        sc.proxy.blackhole(True)           # n1 hears nothing from Redis: it is cut off
        sc.cleared()                       # calls must recover while the fault lasts
        await asyncio.sleep(EVACUATE_AFTER + 4.5)
        sc.proxy.blackhole(False)

    # the only provider, on n1 first; every client holds every URL
    figures = await run(sc, fault, recover_within=EVACUATE_AFTER + 3.0,
                        in_process_provider_on=(0,))
    assert figures["outcomes"].get("ok", 0) > 0
    [n1] = [n for n in sc.cluster.nodes if n.name == "n1"]
    assert n1.events("clients_sent_elsewhere")
