"""A rolling restart (SIGTERM each node in turn, start it again under its name) under a
steady load costs no call, with the only provider on one node at a time: calls to its
name wait (within their deadline) while it moves to another node. Planned stops are
leaves, never deaths (before: 2-11 calls failed NO_PROVIDER per run, and every stop was
logged and counted as a dead node)."""

import asyncio

from .harness import run


async def test_a_rolling_restart_of_every_node_fails_no_call(scenario):
    sc = scenario(nodes=3)
    processes = []

    async def fault(sc):
        for i in range(3):
            processes.append(sc.cluster.nodes[i])
            await asyncio.to_thread(sc.cluster.restart, i, True)  # drains, exits, restarts
            await asyncio.sleep(0.5)                               # steady load between
        sc.cleared()

    # one provider, on n1 first (it holds every URL and moves as each node stops)
    figures = await run(sc, fault, recover_within=0.5, in_process_provider_on=(0,))
    assert figures["outcomes"] == {"ok": figures["calls"]}, figures["outcomes"]
    processes += sc.cluster.nodes
    assert [p.name for p in processes if p.events("node_dead")] == []
    assert sum(len(p.events("node_left")) + len(p.events("node_rejoined"))
               for p in processes) >= 3
