"""What every process on a call's path costs per call, in instructions, checked against
the committed baselines (benchmarks/cost_baseline.json).

    python -m rpcbus.benchmarks.cost [--shapes local,cross,stream,call_all,deepstream]
                                     [--units 2000] [--check | --write]

A call's cost is every process it passes: each node, the provider's SDK, the caller's
SDK. For each shape, each of those processes in turn runs under ``valgrind
--tool=callgrind`` with instrumentation off while it starts; the others run natively.
After a warm-up, ``callgrind_control`` turns instrumentation on for exactly ``--units``
units of work (calls, stream parts or call_all replies) and off again, so start-up and
shutdown never count. Instruction counts repeat where timings on this machine do not
(the other processes and the machine's load do not move them), and the measured
process is by far the slowest, so it reads full batches, as at full load.

Shapes (every call carries 64 B; ``INFLIGHT`` calls at once on one connection):

=========== ============================================== ====================
shape       where                                          unit
=========== ============================================== ====================
local       one node; provider and caller on it            a call
cross       provider on n1, caller on n2 (a redis-server)  a call
stream      one node; the caller reads streams of PARTS    a part
call_all    one node, two providers; ``call_all``          a reply
deepstream  one node; deepstream's own client (npm) calls  a call (the node only)
=========== ============================================== ====================

The SDKs are measured as users run them: the provider is ``Client.provide`` with an
``async def`` echo (an async generator for streams), the caller awaits
``Client.call`` (``stream``, ``call_all``) in ``INFLIGHT`` concurrent loops.

``--write`` stores the figures as the baselines; ``--check`` compares with them and
exits 1 when one grew more than ``TOLERANCE`` (a change that must cost more updates its
baseline in the same commit, saying why). ``./dev test`` runs the check
(tests/integration/test_cost.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

import rpcbus
from rpcbus.broker.local import RedisServer
from rpcbus.broker.process import NodeProcess

BASELINE = Path(__file__).resolve().parent / "cost_baseline.json"
PEERS = Path(__file__).resolve().parent / "deepstream"
VALGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            "--instr-atstart=no"]
TOLERANCE = 0.05   # a figure this much over its baseline fails the check
INFLIGHT = 50      # calls at once (a stream shape: STREAMS streams at once)
STREAMS = 4
PARTS = 50         # parts per stream
WARMUP = 300       # units before the measured ones
PAYLOAD = {"k": "x" * 64}
# a node under valgrind: long deadlines; its deadline sweep (not per call) rarely
NODE_ENV = {"RPCBUS_RPC_ACK_TIMEOUT": "30", "RPCBUS_RPC_ACK_TIMEOUT_MAX": "60",
            "RPCBUS_RPC_RESPONSE_TIMEOUT": "120", "RPCBUS_RPC_TIMER_GRANULARITY": "0.05",
            "RPCBUS_AUTH_MODE": "none"}


@dataclass(frozen=True)
class Shape:
    nodes: int
    caller_node: int      # the provider is on n1
    providers: int
    kind: str             # what the caller does: call, stream, all, ds
    unit: str

    def roles(self) -> list[str]:
        nodes = [f"n{i + 1}" for i in range(self.nodes)]
        return nodes if self.kind == "ds" else [*nodes, "provider", "caller"]


SHAPES = {
    "local": Shape(1, 0, 1, "call", "call"),
    "cross": Shape(2, 1, 1, "call", "call"),
    "stream": Shape(1, 0, 1, "stream", "part"),
    "call_all": Shape(1, 0, 2, "all", "reply"),
    "deepstream": Shape(1, 0, 1, "ds", "call"),
}


# -- the SDK processes (python -m rpcbus.benchmarks.cost worker ROLE URL KIND) ----------

async def _echo(data: Any) -> Any:
    return data


async def _parts(n: Any) -> Any:
    for i in range(n):
        yield i


async def _drive(client: rpcbus.Client, kind: str, units: int) -> None:
    """``units`` units of ``kind`` work: calls, stream parts or call_all replies."""
    async def calls(n: int) -> None:
        for _ in range(n):
            await client.call("cost.echo", PAYLOAD, timeout=300)

    async def streams(n: int) -> None:
        for _ in range(n):
            async for _part in client.stream("cost.parts", PARTS, timeout=300):
                pass

    async def alls(n: int) -> None:
        for _ in range(n):
            await client.call_all("cost.echo", PAYLOAD, timeout=300)

    work, lanes, per = {"call": (calls, INFLIGHT, 1), "stream": (streams, STREAMS, PARTS),
                        "all": (alls, INFLIGHT // 2, 2)}[kind]
    jobs, extra = divmod(units // per, lanes)
    await asyncio.gather(*(work(jobs + (i < extra)) for i in range(lanes)))


async def _worker(role: str, url: str, kind: str) -> None:
    loop = asyncio.get_running_loop()
    async with rpcbus.connect(url, name=f"cost-{role}") as client:
        if role == "provider":
            await client.provide("cost.echo", _echo)
            await client.provide("cost.parts", _parts)
        else:
            async with asyncio.timeout(120):  # until the provider is routable from here
                while True:
                    try:
                        await client.call("cost.echo", PAYLOAD, timeout=30)
                        break
                    except rpcbus.RpcError:
                        await asyncio.sleep(0.1)
        print("ready", flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            await _drive(client, kind, int(line))
            print("done", flush=True)


# -- the driver -------------------------------------------------------------------------

class _Sdk:
    """A worker process (under valgrind when measured), told what to do on stdin."""

    def __init__(self, role: str, url: str, kind: str, measured: bool) -> None:
        self.proc = subprocess.Popen(
            [*(VALGRIND if measured else []), sys.executable, "-m", "rpcbus.benchmarks.cost",
             "worker", role, url, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if measured else subprocess.DEVNULL, text=True)
        self.pid = self.proc.pid
        self._expect("ready")

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != word:
            raise RuntimeError(f"a cost worker said {line!r}, not {word!r}")

    def run(self, units: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{units}\n")
        self.proc.stdin.flush()
        self._expect("done")

    def stop(self) -> str:
        """Its stderr (valgrind's summary, when measured)."""
        _, err = self.proc.communicate(timeout=300)  # closes stdin: the worker ends
        return err or ""


class _Ds:
    """deepstream's own client (benchmarks/deepstream/peer.js), one JSON line a command."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(["node", str(PEERS / "peer.js")], cwd=str(PEERS),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self._n = 0
        if not self.ask("connect", url=url, login={})["ok"]:
            raise RuntimeError("deepstream's client could not log in")

    def ask(self, op: str, **fields: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._n += 1
        self.proc.stdin.write(json.dumps({"id": self._n, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        while True:
            line = json.loads(self.proc.stdout.readline())
            if line.get("id") == self._n:
                if "error" in line:
                    raise RuntimeError(f"{op}: {line['error']}")
                return line["ok"]

    def run(self, units: int) -> None:
        result = self.ask("load", name="cost.echo", calls=units, inflight=INFLIGHT,
                          data="x" * 64)
        if result["errors"]:
            raise RuntimeError(f"deepstream calls failed: {result['firstError']}")

    def stop(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return ""


def _collected(text: str) -> int:
    found = re.search(r"Collected : (\d+)", text)
    if found is None:
        raise RuntimeError("valgrind printed no instruction count")
    return int(found.group(1))


def _instrument(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)


def measure(shape: Shape, role: str, units: int) -> float:
    """Instructions per unit of ``role``'s process in ``shape``."""
    redis = RedisServer().start() if shape.nodes > 1 else None
    nodes: list[NodeProcess] = []
    peers: list[_Sdk | _Ds] = []
    measured: Any = None
    try:
        for i in range(shape.nodes):
            name = f"n{i + 1}"
            args = ["--name", name, *(["--redis", redis.url] if redis else []),
                    *(["--deepstream"] if shape.kind == "ds" else [])]
            node = NodeProcess(*args, env=NODE_ENV,
                               wrapper=VALGRIND if role == name else None).start(timeout=180)
            nodes.append(node)
            if role == name:
                measured = node
        if shape.kind == "ds":
            provider = _Ds(nodes[0].url + "/deepstream")
            provider.ask("provide", name="cost.echo", kind="echo")
            ds_caller = _Ds(nodes[shape.caller_node].url + "/deepstream")
            peers += [provider, ds_caller]
            caller: _Sdk | _Ds = ds_caller
            for _ in range(600):  # until the name is routable (provide is not answered)
                try:
                    ds_caller.ask("make", name="cost.echo", data="x")
                    break
                except RuntimeError:
                    time.sleep(0.05)
        else:
            for p in range(shape.providers):
                peers.append(_Sdk("provider", nodes[0].url, shape.kind,
                                  role == "provider" and p == 0))
            caller = _Sdk("caller", nodes[shape.caller_node].url, shape.kind, role == "caller")
            peers.append(caller)
            if role in ("provider", "caller"):
                measured = peers[0] if role == "provider" else caller
        caller.run(WARMUP)
        _instrument(measured.pid, True)
        caller.run(units)
        _instrument(measured.pid, False)
    finally:  # every process stops, whatever failed
        errs: dict[int, str] = {}
        with contextlib.ExitStack() as stopping:
            if redis is not None:
                stopping.callback(redis.stop)
            for node in nodes:
                stopping.callback(node.stop, timeout=180)
            for peer in peers:
                stopping.callback(lambda peer=peer: errs.update({id(peer): peer.stop()}))
    if isinstance(measured, NodeProcess):
        text = "\n".join(line.get("text", "") for line in measured.lines)
    else:
        text = errs[id(measured)]
    return _collected(text) / units


def run(shapes: list[str], units: int) -> dict[str, dict[str, int]]:
    figures: dict[str, dict[str, int]] = {}
    for name in shapes:
        shape = SHAPES[name]
        figures[name] = {}
        for role in shape.roles():
            figures[name][role] = round(measure(shape, role, units))
            print(f"{name:10} {role:9} {figures[name][role]:>9,} instructions per "
                  f"{shape.unit}", flush=True)
        total = sum(figures[name].values())
        print(f"{name:10} {'all':9} {total:>9,} instructions per {shape.unit}", flush=True)
    return figures


def check(figures: dict[str, dict[str, int]], baseline: dict[str, Any]) -> list[str]:
    """One line per figure over its baseline by more than ``TOLERANCE``."""
    over = []
    for shape, roles in figures.items():
        for role, value in roles.items():
            base = baseline.get(shape, {}).get(role)
            if base is None:
                over.append(f"{shape} {role}: {value:,} has no baseline (run with --write)")
            elif value > base * (1 + TOLERANCE):
                over.append(f"{shape} {role}: {value:,} instructions per "
                            f"{SHAPES[shape].unit}, {value / base - 1:+.1%} over its baseline "
                            f"{base:,} (more than {TOLERANCE:.0%}): find what costs more, or "
                            f"update {BASELINE.name} in the same commit, saying why")
    return over


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["worker"]:
        logging.basicConfig(level=logging.WARNING)
        asyncio.run(_worker(*argv[1:4]))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated")
    ap.add_argument("--units", type=int, default=2000, help="measured units per process")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="fail on growth over baseline")
    what.add_argument("--write", action="store_true", help="store these as the baselines")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape {unknown[0]!r}: choose from {', '.join(SHAPES)}")
    for tool in ("valgrind", "callgrind_control") + (("node",) if "deepstream" in shapes
                                                     else ()):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool}: run ./dev setup (or apt-get install valgrind "
                             "nodejs)")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    figures = run(shapes, args.units)
    if args.write:
        stored = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
        stored.update(figures)
        BASELINE.write_text(json.dumps(stored, indent=2) + "\n")
        print(f"wrote {BASELINE}")
    elif args.check:
        over = check(figures, json.loads(BASELINE.read_text()))
        for line in over:
            print(f"COST: {line}")
        if over:
            raise SystemExit(1)
        print(f"every figure within {TOLERANCE:.0%} of {BASELINE.name}")


if __name__ == "__main__":
    main()
