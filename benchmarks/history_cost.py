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

import asyncio
import shutil
import tempfile

import rpcbus
from rpcbus.benchmarks.callgrind import (
    CALLGRIND,
    SLOW_NODE_ENV,
    collected,
    echo,
    echo_calls,
    options,
)
from rpcbus.broker.process import NodeProcess


async def _load(url: str, calls: int, inflight: int) -> None:
    async with rpcbus.connect(url, name="worker") as prov, rpcbus.connect(url) as caller:
        await prov.provide("cost.echo", echo)
        await echo_calls([caller], calls, inflight)


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


def main(argv: list[str] | None = None) -> None:
    low, high, inflight, _ = options(__doc__, "4000,16000", argv)
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
