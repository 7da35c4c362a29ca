"""What recording the load history costs a node per call, in instructions.

    python -m rpcbus.benchmarks.history_cost [--calls 4000,16000] [--inflight 200]

Runs a real node under ``valgrind --tool=callgrind`` (instruction counts repeat
where timings on this machine do not), without and with ``[history] dir``, and
drives it from this process: one provider, one caller, ``--inflight`` calls at
once. Under valgrind the node is the bottleneck by far, so it reads large
batches as at full load. Each setting runs with two call counts; the difference
over the difference in calls is the node's instructions per call, start-up and
shutdown cancelled out. Prints both and the history's share.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
import tempfile

import structlog

import rpcbus
from rpcbus.broker.process import NodeProcess


async def _load(url: str, calls: int, inflight: int) -> None:
    async with rpcbus.connect(url, name="worker") as prov, rpcbus.connect(url) as caller:
        await prov.provide("cost.echo", lambda d: d)
        await echo_calls(caller, calls, inflight)


async def echo_calls(caller: rpcbus.Client, calls: int, inflight: int) -> None:
    """``calls`` calls of cost.echo with 64 B of data, ``inflight`` at once."""
    gate = asyncio.Semaphore(inflight)
    payload = {"k": "x" * 64}

    async def one() -> None:
        async with gate:
            await caller.call("cost.echo", payload, timeout=120)

    await asyncio.gather(*(one() for _ in range(calls)))


# A node under valgrind, slow: its call deadlines long enough for the load
CALLGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
SLOW_NODE_ENV = {"RPCBUS_SERVER_UVLOOP": "true", "RPCBUS_RPC_ACK_TIMEOUT": "30",
                 "RPCBUS_RPC_RESPONSE_TIMEOUT": "120"}


def instructions(calls: int, inflight: int, history: str | None) -> int:
    env = dict(SLOW_NODE_ENV)
    if history:
        env["RPCBUS_HISTORY_DIR"] = history
    node = NodeProcess(env=env, wrapper=CALLGRIND).start(timeout=120)
    try:
        asyncio.run(_load(node.url, calls, inflight))
    finally:
        node.stop(timeout=120)
    return collected(node)


def collected(node: NodeProcess) -> int:
    """The instructions valgrind counted in ``node``, a stopped node run under CALLGRIND."""
    for line in node.lines:
        found = re.search(r"Collected : (\d+)", line.get("text", ""))
        if found:
            return int(found.group(1))
    raise RuntimeError("valgrind printed no instruction count")


def options(doc: str, calls: str, argv: list[str] | None) -> tuple[int, int, int]:
    """A callgrind benchmark's command line (``--calls`` defaulting to ``calls``,
    ``--inflight``): the two call counts and the calls in flight. Quiets the log and
    exits with what to do when valgrind is missing."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", default=calls, help="two call counts")
    ap.add_argument("--inflight", type=int, default=200)
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    low, high = (int(x) for x in args.calls.split(","))
    return low, high, args.inflight


def main(argv: list[str] | None = None) -> None:
    low, high, inflight = options(__doc__, "4000,16000", argv)
    folder = tempfile.mkdtemp(prefix="rpcbus-history-cost-")
    per_call = {}
    try:
        for label, history in (("off", None), ("on", folder)):
            a = instructions(low, inflight, history)
            b = instructions(high, inflight, history)
            per_call[label] = (b - a) / (high - low)
            print(f"history {label:3}: {per_call[label]:,.0f} instructions per call", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    added = per_call["on"] - per_call["off"]
    print(f"recording adds {added:,.0f} instructions per call: "
          f"{added / per_call['off'] * 100:.1f}% of the node's work per call")


if __name__ == "__main__":
    main()
