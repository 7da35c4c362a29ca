"""What the WebSocket stack alone costs a server per call: rpcbus's against picows'.

    python -m rpcbus.benchmarks.ws_stack [--payload 64,65536] [--rounds 3]
        [--conns 4] [--inflight 20] [--duration 3] [--also NAME=PYTHONPATH ...]

An echo server answers the lean caller's REQUESTs itself (``workers echo``: decode
the frame, answer each message, one frame per loop tick), so routing costs nothing
and what is left is the I/O stack: reading and unmasking client frames, framing and
writing the answers. Each stack runs in turn, ``--rounds`` times interleaved (this
machine's speed moves between minutes), and the figure is the server process's CPU
time per call (user + system, psutil), with calls per second beside. ``--also``
adds the same echo from another tree of rpcbus (a ``pip install --target`` of it),
e.g. the release before a change to the stack.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any


def _start_echo(stack: str, pythonpath: str | None) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen([sys.executable, "-m", "rpcbus.benchmarks.workers", "echo",
                             "--stack", stack] if not pythonpath else
                            [sys.executable, "-m", "rpcbus.benchmarks.workers", "echo"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())["url"]


def measure(stack: str, pythonpath: str | None, payload: int, conns: int, inflight: int,
            duration: float) -> dict[str, float]:
    """One run: the echo server's CPU µs per call and the calls per second."""
    import psutil

    proc, url = _start_echo(stack, pythonpath)
    try:
        server = psutil.Process(proc.pid)
        caller = subprocess.Popen(
            [sys.executable, "-m", "rpcbus.benchmarks.workers", "caller", "--url", url,
             "--conns", str(conns), "--inflight", str(inflight), "--payload", str(payload),
             "--duration", str(duration), "--warmup", "1", "--start-at", "0"],
            stdout=subprocess.PIPE, text=True)
        time.sleep(1.0 + 0.2)  # the warmup, then the measured window
        before = server.cpu_times()
        out, _ = caller.communicate(timeout=duration + 60)
        after = server.cpu_times()
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        proc.terminate()
        proc.wait(10)
    calls = result["measured"]
    cpu = (after.user - before.user) + (after.system - before.system)
    return {"cpu_us_per_call": cpu / max(calls, 1) * 1e6,
            "calls_per_s": calls / max(result["span"], 1e-9)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.ws_stack",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--payload", default="64,65536", help="bytes of data per call, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--inflight", type=int, default=20)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PYTHONPATH",
                    help="the echo of another rpcbus tree, installed at PYTHONPATH")
    args = ap.parse_args(argv)
    stacks: list[tuple[str, str, str | None]] = [("rpcbus", "rpcbus", None),
                                                 ("picows", "picows", None)]
    for extra in args.also:
        name, _, path = extra.partition("=")
        stacks.append((name, "rpcbus", path))
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for payload in (int(p) for p in args.payload.split(",")):
        for _ in range(args.rounds):
            for name, stack, path in stacks:
                results.setdefault((name, payload), []).append(
                    measure(stack, path, payload, args.conns, args.inflight, args.duration))
    rows: list[dict[str, Any]] = []
    for (name, payload), runs in results.items():
        rows.append({"stack": name, "payload": payload,
                     "cpu_us_per_call": round(statistics.median(
                         r["cpu_us_per_call"] for r in runs), 2),
                     "calls_per_s": round(statistics.median(r["calls_per_s"] for r in runs)),
                     "runs": [round(r["cpu_us_per_call"], 2) for r in runs]})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
