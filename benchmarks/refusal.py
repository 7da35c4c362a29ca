"""What refusing a flood costs a node against serving the same flood, in one run.

    python -m rpcbus.benchmarks.refusal                  # 3 rounds x 2 kinds x 40 frames
    python -m rpcbus.benchmarks.refusal --frames 20 --rounds 1

One node (auth mode users). A raw client sends frames of 10,000 PINGs, then
10,000 REQUESTs for an rpc nobody provides, as user ``free`` (no rate limit:
every PING answered with a PONG, every REQUEST with NO_PROVIDER) and as user
``limited`` (1 request per window: everything after the first refused with
RATE_LIMITED). The node's CPU time (from /proc, via psutil) per message is
reported for each, with refused/served as the ratio; the two users alternate
over ``--rounds`` rounds so drift on a noisy machine hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

import msgpack
import psutil
from websockets.asyncio.client import connect

from rpcbus import protocol as p
from rpcbus.broker.auth import token_digest
from rpcbus.broker.process import NodeProcess

PER_FRAME = 10_000


async def _flood(url: str, user: str, kind: int, frames: int) -> None:
    async with connect(url, compression=None, max_size=None) as ws:
        await ws.send(msgpack.packb([p.AUTH, {"protocol": 1, "token": f"{user}-token"}]))
        assert p.decode(await ws.recv())[0][0] == p.AUTH_OK
        if kind == p.PING:
            frame = msgpack.packb([[p.PING]] * PER_FRAME)
        else:
            frame = msgpack.packb([[p.REQUEST, i, "nobody.here", None, 5000]
                                   for i in range(PER_FRAME)])
        for _ in range(frames):
            await ws.send(frame)
        # until the node has worked off the flood: every REQUEST gets its outcome, every
        # PING a PONG when served, every frame of refused PINGs one ERROR
        want = frames if kind == p.PING and user == "limited" else frames * PER_FRAME
        got = 0
        counted = p.PONG if kind == p.PING and user == "free" else p.ERROR
        async with asyncio.timeout(120):
            while got < want:
                got += sum(m[0] == counted for m in p.decode(await ws.recv()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    users = {u: {"token_sha256": token_digest(f"{u}-token"), "call": ["*"]}
             for u in ("free", "limited")}
    users["limited"]["rate_messages"] = 1
    node = NodeProcess(env={"RPCBUS_AUTH_MODE": "users",
                            "RPCBUS_AUTH_USERS": json.dumps(users)}).start()
    try:
        proc = psutil.Process(node.proc.pid)  # type: ignore[union-attr]
        cpu: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for kind, label in ((p.PING, "PING"), (p.REQUEST, "REQUEST")):
                for user in ("free", "limited"):
                    before = sum(proc.cpu_times()[:2])
                    asyncio.run(_flood(node.url, user, kind, args.frames))
                    used = sum(proc.cpu_times()[:2]) - before
                    cpu.setdefault((label, user), []).append(
                        used / (args.frames * PER_FRAME) * 1e6)
    finally:
        node.stop()
    print(f"node CPU per message, µs (median of {args.rounds} rounds, "
          f"{args.frames} frames x {PER_FRAME:,} messages each)")
    for label in ("PING", "REQUEST"):
        served = statistics.median(cpu[(label, "free")])
        refused = statistics.median(cpu[(label, "limited")])
        print(f"  {label:<8} served {served:6.2f}   refused {refused:6.2f}   "
              f"refused/served {refused / served:.2f}")


if __name__ == "__main__":
    main()
