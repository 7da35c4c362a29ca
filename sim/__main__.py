"""``python -m rpcbus.sim``: run seeded schedules and report what held and what did not."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

import structlog

from rpcbus.sim.run import run_seed
from rpcbus.sim.world import ALL_FAULTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rpcbus.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed, with its violations")
    parser.add_argument("--faults", default=",".join(ALL_FAULTS),
                        help=f"faults to draw from (comma-separated; of {','.join(ALL_FAULTS)})")
    parser.add_argument("--load", type=float, default=6.0, help="simulated seconds of load")
    parser.add_argument("--streams", action="store_true",
                        help="a quarter of the calls are streams, a tenth call_alls (checked too)")
    parser.add_argument("--events", action="store_true",
                        help="publishers and subscribers beside the calls (sim/events.py)")
    parser.add_argument("--rules", choices=("current", "before-37"), default="current",
                        help="the provider rules to run (before-37: the ones #37 fixed)")
    args = parser.parse_args(argv)
    allowed = tuple(f for f in args.faults.split(",") if f)
    unknown = set(allowed) - set(ALL_FAULTS)
    if unknown:
        parser.error(f"unknown faults {', '.join(sorted(unknown))}: use {','.join(ALL_FAULTS)}")
    quiet()
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    began = time.monotonic()
    calls = failed = 0
    outcomes: Counter[str] = Counter()
    for seed in seeds:
        result = run_seed(seed, allowed, args.load, args.rules, streams=args.streams,
                          events=args.events)
        calls += result.calls
        outcomes.update(result.outcomes)
        if not result.ok:
            failed += 1
            print(f"seed {seed} FAILED (faults {result.faults}, {result.calls} calls): "
                  f"{len(result.violations)} violations")
            for line in result.violations[:10]:
                print(f"  {line}")
            print(f"  replay: python -m rpcbus.sim --seed {seed} --faults {args.faults} "
                  f"--load {args.load:g} --rules {args.rules}"
                  + (" --streams" if args.streams else ""))
        elif args.seed is not None:
            print(f"seed {seed} held (faults {result.faults}): {result.calls} calls, "
                  f"outcomes {result.outcomes}")
    took = time.monotonic() - began
    print(f"{len(seeds)} seeds, {calls} simulated calls, {failed} failed, {took:.1f} s")
    print("outcomes: " + ", ".join(f"{code} {n}" for code, n in outcomes.most_common()))
    return 1 if failed else 0


def quiet() -> None:
    """The cores log as a node does; a run of thousands of faults says it once, here."""
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    logging.disable(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
