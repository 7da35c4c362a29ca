"""Micro benchmarks of the pure parts, apart from the end-to-end load (no sockets).

    python -m rpcbus.benchmarks.micro

Prints µs per operation (the least of 5 interleaved rounds) for the router (one call: REQUEST in,
RESPONSE in) and
the codec (decode, check and encode one message of a 60-message frame), each
next to a baseline measured in the same run: a dict insert + delete, the least
any call table must do. Ratios to it compare across machines; microseconds
do not.
"""

from __future__ import annotations

import time
from typing import Any

from rpcbus.broker.router import Router
from rpcbus.protocol import REQUEST, check_from_client, decode, encode


class _Peer:
    __slots__ = ("label", "closed", "inflight", "calls", "provides", "out", "is_node",
                 "provider_name", "hrows", "accepted_upto", "runs_before_accept", "load",
                 "attempts", "lat", "seen", "steady", "minutes", "pace", "user_name",
                 "origin")

    def __init__(self, label: str) -> None:
        self.label, self.closed, self.inflight, self.is_node = label, False, 0, False
        self.provider_name = label
        self.calls: dict[int, Any] = {}
        self.accepted_upto = 0
        self.runs_before_accept = False
        self.load = self.attempts = 0
        self.lat = self.seen = self.steady = 0.0
        self.minutes: Any = None
        self.pace: Any = None
        self.user_name: str | None = None
        self.origin = ""
        self.hrows: dict[Any, Any] = {}
        self.provides: set[str] = set()
        self.out: list[list[Any]] = []

    def send(self, msg: list[Any]) -> None:
        self.out.append(msg)


def _per_op(fn: Any, n: int) -> float:
    fn(n // 10)  # warm up
    t0 = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t0) / n * 1e6


def bench_router(n: int, history: bool = False, metrics: bool = True) -> None:
    r = Router(ack_timeout=1.0, response_timeout=10.0, max_timeout=60.0, now=0.0,
               clock=time.perf_counter if metrics else None)
    if history:
        from rpcbus.broker.history import History

        r.record(History("n1", 10.0, None, time.time()))
    caller, prov = _Peer("c"), _Peer("p")
    r.provide(prov, ["bench.echo"])
    data = b"x" * 16
    to_prov, to_caller = prov.out, caller.out
    for i in range(n):
        r.request(caller, i, "bench.echo", data, 10_000, 0.0)
        r.respond(prov, to_prov.pop()[1], data)
        to_caller.pop()
    r.tick(100.0)


def bench_codec(n: int) -> None:
    frame = encode([[REQUEST, i, "bench.echo", b"x" * 16, 10_000] for i in range(60)])
    for _ in range(max(1, n // 60)):
        msgs = decode(frame)
        for m in msgs:
            check_from_client(m)
        encode(msgs)


def bench_dict(n: int) -> None:
    d: dict[int, int] = {}
    for i in range(n):
        d[i] = i
        del d[i]


def main(rounds: int = 5) -> None:
    n = 200_000
    variants = {"base": bench_dict, "bare": lambda k: bench_router(k, metrics=False),
                "router": bench_router, "history": lambda k: bench_router(k, history=True),
                "codec": bench_codec}
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):  # interleaved; the least of the rounds (this machine is noisy)
        for name, fn in variants.items():
            best[name] = min(best[name], _per_op(fn, n))
    base, bare, router, history, codec = (best[k] for k in variants)
    print(f"baseline dict insert+delete   {base:6.3f} µs")
    print(f"router, one call, no metrics  {bare:6.3f} µs   {bare / base:5.1f}x baseline")
    print(f"router, one call              {router:6.3f} µs   {router / base:5.1f}x baseline"
          f"   (per-rpc metrics: +{router - bare:.3f} µs)")
    print(f"router + load history         {history:6.3f} µs   {history / base:5.1f}x baseline"
          f"   (history: +{history - router:.3f} µs)")
    print(f"codec, per message            {codec:6.3f} µs   {codec / base:5.1f}x baseline")


if __name__ == "__main__":
    main()
