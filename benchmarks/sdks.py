"""The SDKs side by side: JS callers (clients/js) and Python callers through their SDKs
against the same node, provider and shape, plus the lean raw caller of
``rpcbus bench`` as the reference; calls/s, latency and the node's CPU per call.

\b
    python -m rpcbus.benchmarks.sdks                       # 4 callers x 50 in flight
    python -m rpcbus.benchmarks.sdks --conns 50 --inflight 1 --rounds 2

Each round runs the three callers one after the other on the same node; the ratios
are against the Python SDK of the same round. Needs Node.js and ``npm ci`` in
clients/js (``./dev test`` does both), so it runs from a checkout, not a wheel.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

import rpcbus
from rpcbus.benchmarks import load
from rpcbus.broker.process import NodeProcess

JS_CALLER = Path(rpcbus.__file__).resolve().parent / "js" / "bench" / "caller.js"


def _callers() -> dict[str, dict[str, Any]]:
    node = shutil.which("node")
    if node is None or not (JS_CALLER.parent.parent / "node_modules" / "@msgpack").is_dir():
        raise click.ClickException(
            "the JS SDK is not ready: run from a checkout after ./dev test (Node.js and "
            "npm ci in clients/js)")
    return {"lean raw caller": {"role": "caller"},
            "Python SDK": {"role": "sdk-caller"},
            "JS SDK": {"program": [node, str(JS_CALLER)]}}


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--callers", type=click.IntRange(min=1), default=4, show_default=True,
              help="Caller processes.")
@click.option("--conns", type=click.IntRange(min=1), default=1, show_default=True,
              help="Connections per caller process.")
@click.option("--inflight", type=click.IntRange(min=1), default=50, show_default=True,
              help="Calls in flight per connection.")
@click.option("--payload", type=click.IntRange(min=0), default=16, show_default=True,
              help="Bytes of data per call.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Measured seconds per caller kind.")
@click.option("--warmup", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds before measuring.")
@click.option("--max-calls", type=click.IntRange(min=1), default=3_000_000, show_default=True,
              help="Hard cap on calls per caller kind.")
@click.option("--rounds", type=click.IntRange(min=1, max=5), default=1, show_default=True,
              help="Times to run the three callers in turn.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="A directory to write result.json into.")
def command(**opts: Any) -> list[dict[str, Any]]:
    args = SimpleNamespace(rpc="bench.echo", **opts)
    callers = _callers()
    rows: list[dict[str, Any]] = []
    node = NodeProcess().start()
    provider = load._spawn("provider", "--url", node.url, "--rpc", args.rpc)
    try:
        load._first_line(provider)
        for round_no in range(1, args.rounds + 1):
            for kind, how in callers.items():
                print(f"round {round_no}: {kind} ...", file=sys.stderr)
                r = load.run_callers([node.url], args, cpu_of=load._cpu_reader([node.proc.pid]),
                                     stats_urls=[node.url], **how)
                rows.append({"round": round_no, "caller": kind,
                             **{k: v for k, v in r.items() if not k.startswith("_")
                                and k != "throughput_series"}})
    finally:
        provider.kill()
        provider.wait()
        node.stop()
    click.echo(_table(rows, args))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(rows, indent=2))
    return rows


def _table(rows: list[dict[str, Any]], args: SimpleNamespace) -> str:
    lines = [f"1 node, 1 provider, {args.callers} caller process(es) x {args.conns} conn(s) x "
             f"{args.inflight} in flight, payload {args.payload} B",
             f"{'round':>5} {'caller':<16} {'calls/s':>10} {'p50 µs':>8} {'p99 µs':>8} "
             f"{'node µs/call':>12} {'calls/s ÷ Py':>12} {'µs/call ÷ Py':>12} errors"]
    for row in rows:
        py = next(r for r in rows if r["round"] == row["round"] and r["caller"] == "Python SDK")
        lines.append(
            f"{row['round']:>5} {row['caller']:<16} {row['calls_per_s']:>10,.0f} "
            f"{row['p50_us']:>8.0f} {row['p99_us']:>8.0f} {row['node_cpu_us_per_call']:>12.2f} "
            f"{row['calls_per_s'] / py['calls_per_s']:>12.2f} "
            f"{row['node_cpu_us_per_call'] / py['node_cpu_us_per_call']:>12.2f} "
            f"{row['errors'] or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = command.main(argv, prog_name="python -m rpcbus.benchmarks.sdks",
                                              standalone_mode=False)
    return rows


if __name__ == "__main__":
    command()
