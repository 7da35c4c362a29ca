"""What history_cost and cross_cost share: a node run under callgrind, the calls they
drive through it, the instructions valgrind counted, and their command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import shutil
from typing import Any

import structlog

import rpcbus
from rpcbus.broker.process import NodeProcess


async def echo(data: Any) -> Any:
    """The provider's handler: answers in the tick it starts, on the client's loop (a
    plain function would run in a worker thread, and its pace would shape the batches
    the measured node sees)."""
    return data


async def echo_calls(callers: list[rpcbus.Client], calls: int, inflight: int) -> None:
    """``calls`` calls of cost.echo with 64 B of data, shared out over ``callers``,
    ``inflight`` at once on each."""
    payload = {"k": "x" * 64}

    async def on(client: rpcbus.Client, n: int) -> None:
        gate = asyncio.Semaphore(inflight)

        async def one() -> None:
            async with gate:
                await client.call("cost.echo", payload, timeout=120)

        await asyncio.gather(*(one() for _ in range(n)))

    share, extra = divmod(calls, len(callers))
    await asyncio.gather(*(on(c, share + (i < extra)) for i, c in enumerate(callers)))


# A node under valgrind, slow: its call deadlines long enough for the load
CALLGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
SLOW_NODE_ENV = {"RPCBUS_SERVER_UVLOOP": "true", "RPCBUS_RPC_ACK_TIMEOUT": "30",
                 "RPCBUS_RPC_RESPONSE_TIMEOUT": "120"}


def collected(node: NodeProcess) -> int:
    """The instructions valgrind counted in ``node``, a stopped node run under CALLGRIND."""
    for line in node.lines:
        found = re.search(r"Collected : (\d+)", line.get("text", ""))
        if found:
            return int(found.group(1))
    raise RuntimeError("valgrind printed no instruction count")


def options(doc: str, calls: str, argv: list[str] | None,
            conns: bool = False) -> tuple[int, int, int, int]:
    """A callgrind benchmark's command line (``--calls`` defaulting to ``calls``,
    ``--inflight``; ``--conns`` when ``conns``): the two call counts, the calls in
    flight (per connection) and the caller connections (1 without ``conns``). Quiets
    the log and exits with what to do when valgrind is missing."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", default=calls, help="two call counts")
    ap.add_argument("--inflight", type=int, default=200, help="calls in flight per connection")
    if conns:
        ap.add_argument("--conns", type=int, default=1, help="caller connections")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    low, high = (int(x) for x in args.calls.split(","))
    return low, high, args.inflight, getattr(args, "conns", 1)
