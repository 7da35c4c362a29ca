"""A steady load through a real cluster, a ledger of every call, and the checks on it.

Every scenario: two nodes (n1, n2) on an embedded redis-server (or Redis Cluster),
providers on both,
callers on both with several hundred calls in flight, one fault, then these checks:

* every call made ended exactly once: its own data back, or an error whose code is
  documented (rpcbus.errors.CODES), no later than its deadline plus ``GRACE``;
* no provider ran any call twice (providers record every completed run) — except,
  where the scenario kills a process or holds up replies (Redis paused), calls that
  were in flight at that moment (docs/cluster.md, "run at most once"); those are
  counted and reported (docs/reliability.md);
* after the fault cleared, every call succeeds again within the scenario's bound;
* no node exited that the scenario did not kill;
* afterwards, calls pending on every node return to 0 and asyncio tasks to their
  baseline (no leaks).

With FAULTS_REPORT_DIR set to a directory, each scenario writes its figures
there as JSON (benchmarks/reliability.py turns them into docs/reliability.md).
With FAULTS_LOG_DIR set, the nodes' logs go there (n1.log, ...), and ledger.txt
lists every call that failed (start and end, s from the first call; its data; its code).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import rpcbus
from rpcbus.broker.local import LocalCluster
from rpcbus.errors import CODES, OVERLOADED

from ..quiet import no_gc_pauses
from .proxy import Proxy

TIMEOUT = 3.0       # each call's deadline, seconds
GRACE = 1.5         # how late past its deadline an outcome may arrive (the SDK's guard: +1 s)
IN_FLIGHT = 100     # per caller; two callers: 200 in flight

ENV = {
    "RPCBUS_RPC_ACK_TIMEOUT": "1.0",
    "RPCBUS_RPC_RESPONSE_TIMEOUT": "5.0",
    "RPCBUS_CLUSTER_HEARTBEAT_INTERVAL": "0.25",
    "RPCBUS_CLUSTER_HEARTBEAT_MISSES": "3",
    "RPCBUS_SERVER_DRAIN_TIMEOUT": "5.0",
}


def stats(node: Any) -> dict[str, Any]:
    with urllib.request.urlopen(node.url.replace("ws://", "http://") + "/stats",
                                timeout=5) as r:
        return json.load(r)


@dataclass
class Entry:
    started: float
    ended: float
    data: list[Any]
    result: Any            # the answer, or the error code
    message: str = ""      # the error's message


@dataclass
class Load:
    """Callers on every node calling ``rpc`` until stopped; every call goes in the ledger."""

    clients: list[rpcbus.Client]
    rpc: str = "echo"
    ledger: list[Entry] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        for ci, client in enumerate(self.clients):
            for w in range(IN_FLIGHT):
                self._tasks.append(asyncio.create_task(self._worker(client, ci, w)))

    async def _worker(self, client: rpcbus.Client, ci: int, w: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            data = [ci, w, i]
            t0 = time.monotonic()
            try:
                result = await client.call(self.rpc, data, timeout=TIMEOUT)
            except rpcbus.RpcError as exc:
                self.ledger.append(Entry(t0, time.monotonic(), data, exc.code, str(exc)))
                continue
            self.ledger.append(Entry(t0, time.monotonic(), data, result))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks)


class Scenario:
    """The cluster, providers and callers of one scenario, and its checks."""

    def __init__(self, name: str, tmp: str, nodes: int = 2, proxied: int | None = None,
                 node_env: list[dict[str, str]] | None = None, redis_shards: int = 0,
                 redis_replicas: int = 0, **env: str) -> None:
        self.name = name
        self.tmp = tmp
        cluster = LocalCluster(nodes=nodes, env={**ENV, **env}, node_env=node_env,
                               redis_shards=redis_shards, redis_replicas=redis_replicas,
                               redis_node_timeout_ms=1000,
                               log_dir=os.environ.get("FAULTS_LOG_DIR"))
        self.proxy: Proxy | None = None   # between node ``proxied`` and Redis
        if proxied is not None:
            assert cluster.redis is not None
            self.proxy = Proxy(cluster.redis.port).start()
            cluster.node_redis = {proxied: self.proxy.url}
        try:
            self.cluster = cluster.start()
        except BaseException:
            if self.proxy is not None:
                self.proxy.stop()
            raise
        self.nodes = self.cluster.nodes
        self.urls = [n.url for n in self.nodes]
        self.runs: Counter[tuple[int, ...]] = Counter()
        self.procs: list[subprocess.Popen[str]] = []
        self.records: list[str] = []
        self.killed: set[str] = set()
        self.clear_at = 0.0
        self.crash_at: float | None = None  # when the scenario killed a process
        self.baseline_tasks: dict[str, int] = {}

    # -- parts -----------------------------------------------------------------------

    async def echo(self, data: Any) -> Any:  # on the loop: runs counted without a race
        self.runs[tuple(data)] += 1
        return data

    async def provider(self, url_index: int, handler: Any = None,
                       rpc: str = "echo", pinned: bool = False) -> rpcbus.Client:
        """An in-process provider connected to node ``url_index`` (the others as spares,
        unless ``pinned``: then it only ever reconnects to that node)."""
        urls = self.urls[url_index:] + self.urls[:url_index]
        if pinned:
            urls = urls[:1]
        client = await rpcbus.connect(urls)
        await client.provide(rpc, handler or self.echo)
        return client

    def provider_process(self, url_index: int) -> subprocess.Popen[str]:
        """A provider in its own process (so it can be SIGKILLed); it records every run."""
        record = os.path.join(self.tmp, f"provider-{len(self.procs)}.log")
        self.records.append(record)
        urls = ",".join(self.urls[url_index:] + self.urls[:url_index])
        proc = subprocess.Popen([sys.executable, "-m", "rpcbus.benchmarks.workers", "provider",
                                 "--url", urls, "--rpc", "echo", "--record", record],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        self.procs.append(proc)
        return proc

    async def callers(self, pinned: bool = False) -> list[rpcbus.Client]:
        """A caller on each node (the others as spares, unless ``pinned``)."""
        return [await rpcbus.connect(self.urls[i:i + 1] if pinned
                                      else self.urls[i:] + self.urls[:i])
                for i in range(len(self.urls))]

    def snapshot_tasks(self) -> None:
        # a session owns no Task (its connection works from callbacks), so the node's
        # task count must come back to this whatever the clients did
        self.baseline_tasks = {n.name: stats(n)["tasks"]
                               for n in self.nodes if n.name not in self.killed}

    def crashed(self) -> None:
        """The scenario just killed a process that may hold calls, or held up replies."""
        self.crash_at = time.monotonic()

    def cleared(self) -> None:
        """The fault is over (the node is back, Redis answers, ...)."""
        self.clear_at = time.monotonic()

    # -- checks ----------------------------------------------------------------------

    def check(self, load: Load, recover_within: float,
              shed_ok: bool = False) -> dict[str, Any]:
        """Every check on ``load``'s ledger (module docstring). ``shed_ok``: the machine
        itself is overloaded (spinning processes beside the test), so OVERLOADED (not run,
        and why) may come at any time, the fault's or not, and does not count against
        recovery; every other failure does, and calls must still be served after it."""
        ledger = load.ledger
        assert ledger, "no call was made"
        outcomes: Counter[str] = Counter()
        said: dict[str, str] = {}  # each error code's first message: why, in a failure
        worst_late = 0.0
        for e in ledger:
            assert e.result == e.data or e.result in CODES, e
            outcomes["ok" if e.result == e.data else e.result] += 1
            if e.message:
                said.setdefault(e.result, e.message)
            worst_late = max(worst_late, e.ended - e.started - TIMEOUT)
        assert worst_late <= GRACE, f"an outcome came {worst_late:.2f} s after its deadline"
        runs = Counter(self.runs)
        for record in self.records:
            with open(record) as f:
                runs.update(tuple(json.loads(line)) for line in f if line.strip())
        twice = {k for k, n in runs.items() if n > 1}
        in_flight_at_crash = {tuple(e.data) for e in ledger if self.crash_at is not None
                              and e.started <= self.crash_at <= e.ended}
        assert twice <= in_flight_at_crash, \
            f"calls run more than once: {sorted(twice - in_flight_at_crash)[:5]}"
        def failed(e: Entry) -> bool:
            return e.result != e.data and not (shed_ok and e.result == OVERLOADED)

        failures = [e for e in ledger if failed(e) and e.started >= self.clear_at]
        self.write_failures(ledger)
        recovery = max((e.started - self.clear_at for e in failures), default=0.0)
        assert recovery <= recover_within, (
            f"calls still failed {recovery:.2f} s after the fault cleared: "
            f"{Counter(e.result for e in failures)}")
        after = [e for e in ledger if e.started >= self.clear_at + recover_within]
        assert any(e.result == e.data for e in after), "no call was served after recovery"
        assert not any(failed(e) for e in after)
        for node in self.nodes:
            if node.name not in self.killed:
                assert node.proc.poll() is None, f"{node.name} exited with {node.proc.poll()}"
        return {"scenario": self.name, "calls": len(ledger), "outcomes": dict(outcomes),
                "said": said,
                "ran_twice": len(twice), "in_flight_at_crash": len(in_flight_at_crash),
                "worst_late_s": round(max(worst_late, 0.0), 3),
                "recovery_s": round(recovery, 3), "recovery_bound_s": recover_within}

    def write_failures(self, ledger: list[Entry]) -> None:
        """FAULTS_LOG_DIR/ledger.txt: when the fault cleared, then each failed call."""
        folder = os.environ.get("FAULTS_LOG_DIR")
        if not folder:
            return
        t0 = ledger[0].started
        with open(os.path.join(folder, "ledger.txt"), "w") as f:
            f.write(f"cleared {self.clear_at - t0:.3f}\n")
            for e in sorted(ledger, key=lambda e: e.started):
                if e.result != e.data:
                    f.write(f"{e.started - t0:.3f} {e.ended - t0:.3f} {e.data} {e.result} "
                            f"{e.message}\n")

    async def check_no_leaks(self) -> None:
        for node in self.nodes:
            if node.name in self.killed:
                continue
            async with asyncio.timeout(TIMEOUT + GRACE + 2):
                while (s := stats(node))["pending"]:  # the last calls may still end
                    await asyncio.sleep(0.1)
            extra = s["tasks"] - self.baseline_tasks.get(node.name, 0)
            assert extra <= 2, f"{node.name}: {extra} more tasks than before the load"

    def report(self, figures: dict[str, Any]) -> None:
        out = os.environ.get("FAULTS_REPORT_DIR")
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"{self.name}.json"), "w") as f:
                json.dump(figures, f)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
        self.cluster.stop()
        if self.proxy is not None:
            self.proxy.stop()


async def run(sc: Scenario, fault: Any, recover_within: float,
              in_process_provider_on: tuple[int, ...] = (0, 1), handler: Any = None,
              rpc: str = "echo", pinned: bool = False,
              shed_ok: bool = False) -> dict[str, Any]:
    """Providers and callers, a steady load, ``fault(sc)``, then every check; the figures.
    ``pinned``: every client only ever (re)connects to its own node; ``shed_ok``: see
    ``Scenario.check``."""
    providers = [await sc.provider(i, handler, rpc, pinned) for i in in_process_provider_on]
    callers = await sc.callers(pinned)
    sc.snapshot_tasks()
    load = Load(callers, rpc)
    with no_gc_pauses():  # a full pass stalled the providers in this process 0.3-1.1 s
        load.start()
        try:
            await asyncio.sleep(1.0)                    # steady load before the fault
            await fault(sc)
            await asyncio.sleep(recover_within + 1.5)   # and after it
        finally:
            await load.finish()
    figures = sc.check(load, recover_within, shed_ok)
    await sc.check_no_leaks()
    sc.report(figures)
    for c in providers + callers:
        await c.close()
    return figures
