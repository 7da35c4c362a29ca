"""What sealing the cluster bus costs: none vs sign vs encrypt, in one run.

    python -m rpcbus.benchmarks.seal          # 2 nodes, cross layout, 2 rounds x 3 modes x 5 s
    python -m rpcbus.benchmarks.seal --rounds 1 --duration 2

Part 1 (pure): seal + open of one batch of 1, 16 and 256 typical messages, µs
per batch and per message. Part 2: the cross-node load benchmark
(benchmarks/load.py, providers on n1, callers on n2) once per mode, the modes
interleaved over ``--rounds`` rounds so drift on a noisy machine hits all
three alike; reported as ratios to ``none`` measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from rpcbus.benchmarks import load
from rpcbus.cluster import messages as m
from rpcbus.cluster.seal import Sealer, new_key

MODES = ("none", "sign", "encrypt")


def micro(repeat: int = 2000) -> dict[str, dict[int, float]]:
    """µs to seal and open one batch of n INVOKE-sized messages, per mode."""
    out: dict[str, dict[int, float]] = {}
    for mode in ("sign", "encrypt"):
        s = Sealer(mode, {"k": new_key()}, "k", 30.0)
        out[mode] = {}
        for n in (1, 16, 256):
            batch = m.encode_batch("n1", 1, 2, 1.0, [[m.INVOKE, i, "bench.echo", "x" * 16, 5000,
                                                 500, "s1"] for i in range(n)])
            t0 = time.perf_counter()
            for _ in range(repeat):
                s.open("rpcbus:node:n2", s.seal("rpcbus:node:n2", batch))
            out[mode][n] = (time.perf_counter() - t0) / repeat * 1e6
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m rpcbus.benchmarks.seal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args(argv)

    pure = micro()
    print("seal + open, µs per batch (per message):")
    for mode, by_n in pure.items():
        print(f"  {mode:8} " + "  ".join(f"{n:>3} msgs: {us:6.1f} ({us / n:5.2f})"
                                         for n, us in by_n.items()))

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            print(f"round {r + 1}/{args.rounds}: seal={mode} ...", file=sys.stderr)
            res = load.main(["--nodes", "2", "--layout", "cross", "--no-baseline",
                             "--duration", str(args.duration), "--seal", mode])
            runs[mode].append(res["rpcbus"])
    table = {mode: {"calls_per_s": statistics.median(x["calls_per_s"] for x in rs),
                    "cpu_us": statistics.median(x["node_cpu_us_per_call"] for x in rs),
                    "p99_us": statistics.median(x["p99_us"] for x in rs)}
             for mode, rs in runs.items()}
    base = table["none"]
    print(f"\n{'seal':8} {'calls/s':>10} {'÷ none':>7} {'node CPU µs/call':>17} {'÷ none':>7} "
          f"{'p99 µs':>8}")
    for mode, t in table.items():
        print(f"{mode:8} {t['calls_per_s']:>10,.0f} {t['calls_per_s'] / base['calls_per_s']:>7.2f}"
              f" {t['cpu_us']:>17.1f} {t['cpu_us'] / base['cpu_us']:>7.2f} {t['p99_us']:>8.0f}")
    return {"micro_us_per_batch": pure, "load": table}


if __name__ == "__main__":
    main()
