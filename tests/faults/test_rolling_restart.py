"""A rolling restart (SIGTERM each node in turn, start it again under its name) under a
steady load costs no call, with the only provider on one node at a time: calls to its
name wait (within their deadline) while it moves to another node. Planned stops are
leaves, never deaths (before: 2-11 calls failed NO_PROVIDER per run, and every stop was
logged and counted as a dead node). On a machine busy with other work (twelve
processes spinning per core) a call may be shed OVERLOADED, which says it did not run
and why, but none ends with a code that says its live, moving provider is gone
(before: NO_PROVIDER, 300-400 calls a run here; 65-82 of ~14,000 in the issue's).
There OVERLOADED is the machine's state, not the fault's: in a slow hour (the test 7x
its usual time) the callers' own load was shed from the first seconds, before any
node stopped, and went on after the last came back, so it does not count against
recovery; every other code does."""

import asyncio

import pytest

from ..busy import spinning
from ..timing import wait
from .harness import run


@pytest.mark.timeout(360)   # busy: a node's start alone took 30 s and more on a slow day
@pytest.mark.parametrize("spinners", [0, 12], ids=["quiet", "busy machine"])
async def test_a_rolling_restart_of_every_node_fails_no_call(scenario, spinners):
    sc = scenario(nodes=3)
    processes = []
    starting = wait(90.0 if spinners else 30.0)   # its imports get a 13th of a core

    async def fault(sc):
        for i in range(3):
            processes.append(sc.cluster.nodes[i])
            # drains, exits, restarts
            await asyncio.to_thread(sc.cluster.restart, i, True, starting)
            await asyncio.sleep(0.5)                               # steady load between
        sc.cleared()

    # one provider, on n1 first (it holds every URL and moves as each node stops)
    with spinning(spinners):  # per core
        figures = await run(sc, fault, recover_within=0.5, in_process_provider_on=(0,),
                            shed_ok=bool(spinners))
    failed = set(figures["outcomes"]) - {"ok"}
    assert failed <= ({"OVERLOADED"} if spinners else set()), (figures["outcomes"],
                                                                figures["said"])
    processes += sc.cluster.nodes
    assert [p.name for p in processes if p.events("node_dead")] == []
    assert sum(len(p.events("node_left")) + len(p.events("node_rejoined"))
               for p in processes) >= 3
