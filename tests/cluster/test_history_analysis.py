"""End to end: load on a real 2-node cluster, the nodes write history, ``rpcbus analyze``
(the real CLI, Spark local[2]) reads it; the calls it counts equal the calls made, a slow
provider is flagged, and the weights file it writes, loaded by the nodes, moves the
calls away from that provider as the weights say. Under ``cluster.policy = "cluster"``,
the weighted draw the weights steer (``local-first`` leaves a slow provider by itself:
tests/cluster/test_choice.py; its fairness: tests/analysis/test_operator_findings.py)."""

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import pytest

import rpcbus

from ..timing import wait

CALLS = 600
SLOW_S = 0.3     # the slow provider's handler; the others answer at once
WINDOW_S = 0.5   # the nodes' history window


async def mid_window():
    """Until the middle of a history window. A node writes a provider's presence row
    when a window closes (on its 0.1 s tick after the boundary, both nodes' boundaries on
    the wall clock), if it is provided then: providers that come or go together, in the
    middle of a window, are in the same windows, so the analysis counts them present
    equally long. (A phase of the wall clock, not an event to await; within one window.)"""
    await asyncio.sleep((WINDOW_S / 2 - time.time() % WINDOW_S) % WINDOW_S)


async def load(c, counted):
    """Three providers of e2e.work (fast-1 on n1, fast-2 and slow-1 on n2), CALLS calls
    from callers on both nodes, 40 at a time; returns how many were answered."""
    n1, n2 = c.nodes

    def fast(name):
        def handler(data):
            counted[name] += 1
            return data
        return handler

    async def slow(data):
        counted["slow-1"] += 1
        await asyncio.sleep(SLOW_S)
        return data

    async with rpcbus.connect(n1.url, name="fast-1") as f1, \
            rpcbus.connect(n2.url, name="fast-2") as f2, \
            rpcbus.connect(n2.url, name="slow-1") as s1, \
            rpcbus.connect(n1.url) as c1, rpcbus.connect(n2.url) as c2:
        await mid_window()
        await asyncio.gather(f1.provide("e2e.work", fast("fast-1")),
                             f2.provide("e2e.work", fast("fast-2")),
                             s1.provide("e2e.work", slow))
        for caller in (c1, c2):   # both nodes know all three providers before the load
            await caller.call("e2e.work", "warm", timeout=5)
        counted.clear()
        gate = asyncio.Semaphore(40)

        async def one(caller, i):
            async with gate:
                return await caller.call("e2e.work", {"i": i}, timeout=10) == {"i": i}

        answered = await asyncio.gather(*(one((c1, c2)[i % 2], i) for i in range(CALLS)))
        # the providers stay two history windows longer, so each has presence rows up to
        # the same end: the analysis judges presence from rows, and in a history of a few
        # seconds slow-1's last window alone (its last call ends 0.3 s after the others')
        # made it look present 25 % longer than the two that left as the load ended
        await asyncio.sleep(wait(2 * WINDOW_S))
        await mid_window()
        await asyncio.gather(f1.close(), f2.close(), s1.close())
    return sum(answered)


def analyze(history, out):
    proc = subprocess.run(
        [sys.executable, "-m", "rpcbus.broker", "analyze", "--history", str(history),
         "--out", str(out), "--master", "local[2]"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "done in" in proc.stdout and "report ->" in proc.stdout
    return proc.stdout


def found(out, table):
    """A small table of the analysis, as report/findings.json has it."""
    with open(out / "report" / "findings.json") as f:
        return json.load(f)[table]


@pytest.mark.timeout(600)
async def test_history_to_analysis_to_weights_and_back(make_cluster, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    c = make_cluster(nodes=2, RPCBUS_HISTORY_DIR=str(history), RPCBUS_HISTORY_WINDOW=str(WINDOW_S),
                     RPCBUS_CLUSTER_POLICY="cluster")
    counted = Counter()
    made = await load(c, counted)
    assert made == CALLS
    for node in c.nodes:
        assert node.stop() == 0                          # the last windows are flushed

    analyze(history, out)
    providers = {r["provider"]: r for r in found(out, "per_provider")
                 if r["rpc"] == "e2e.work"}
    # every call once in the history (plus the two warm-up calls), all answered
    assert sum(r["calls"] for r in providers.values()) == CALLS + 2
    assert sum(r["ok"] for r in providers.values()) == CALLS + 2
    for name, n in counted.items():
        assert providers[name]["calls"] >= n             # warm-ups went somewhere too
    assert providers["slow-1"]["served_by"] == "n2" and providers["fast-1"]["served_by"] == "n1"
    outliers = {(r["provider"], r["kind"]) for r in found(out, "outliers")}
    assert outliers == {("slow-1", "slow")}
    fairness = found(out, "fairness")
    assert all(r["took"] is None for r in fairness), fairness   # weights all 1: fair
    assert all(r["expected_share"] == pytest.approx(1 / 3, abs=0.05) for r in fairness), [
        (r["provider"], r["expected_share"], r["present_s"]) for r in fairness]
    report = (out / "report" / "report.html").read_text()
    assert "<b>slow-1</b> is slow on <b>e2e.work</b>" in report

    weights = json.loads((out / "weights.json").read_text())["rpcs"]["e2e.work"]
    assert weights["fast-1"] == weights["fast-2"] == 1.0 and weights["slow-1"] < 0.2

    # the nodes load the recommended weights: slow-1 gets what its weight says
    c2 = make_cluster(nodes=2, RPCBUS_RPC_WEIGHTS_FILE=str(out / "weights.json"),
                      RPCBUS_CLUSTER_POLICY="cluster")
    counted.clear()
    assert await load(c2, counted) == CALLS
    total = sum(weights.values())
    for name, w in weights.items():
        expected = CALLS * w / total
        # 6 standard deviations of a weighted random choice, at least 5 calls
        assert abs(counted[name] - expected) <= max(5, 6 * (expected * (1 - w / total)) ** .5), \
            (name, counted, weights)
    assert counted["slow-1"] < CALLS / 10 < CALLS / 3
