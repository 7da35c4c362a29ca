"""``rpcbus status``: listen to the cluster's heartbeats for a moment and show who is there."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack

from rpcbus.cluster import messages as m
from rpcbus.cluster.seal import Sealer, SealError, SkewError
from rpcbus.cluster.shards import open_links

CLOCK_WARN_S = 1.0  # a node's clock this far off this machine's gets a line of its own


def stamp_offset(sealed: bytes) -> float | None:
    """A sealed batch's wall-clock stamp minus this machine's clock, in seconds."""
    try:
        header = msgpack.unpackb(sealed)
        return float(header[3]) / 1000 - time.time()
    except Exception:  # not a sealed batch after all: no stamp to read
        return None


async def collect(url: str, namespace: str, listen_s: float,
                  sealer: Sealer | None = None, tls_ca: str = "") -> dict[str, dict[str, Any]]:
    """The latest STATE of every node heard within ``listen_s`` seconds, by node name, on
    any Redis URL a node takes (a Redis Cluster: the control topic's shard).

    With a ``sealer`` (a sealed cluster) only batches that open with its keys count.
    Raises OSError / ConnectionError / ValueError if Redis cannot be read, and
    ``UnopenedError`` when batches were heard but none opened (a sealed bus, and no
    keys or other keys given).
    """
    heard: list[tuple[bytes, bytes]] = []
    links = await open_links(url, [f"{namespace}:ctrl"],
                             lambda channel, data: heard.append((channel, data)), tls_ca)
    try:
        closed = [c.closed for c in links.all]
        done, _ = await asyncio.wait(closed, timeout=listen_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        for ended in done:
            raise ended.result() or ConnectionError("Redis closed the connection")
    finally:
        links.close()
    nodes: dict[str, dict[str, Any]] = {}
    unopened = 0
    for channel, data in heard:
        offset, refused = None, False
        try:
            if sealer is not None:
                try:
                    sealed, data = data, sealer.open(channel.decode(), data)[0]
                    offset = stamp_offset(sealed)
                except SkewError as exc:  # genuine, but its clock is off: say so
                    data, offset, refused = exc.batch, exc.offset_s, True
            batch = m.decode_batch(data)
        except (m.BadBatch, SealError):
            unopened += 1
            continue
        for x in batch.messages:
            if x[0] == m.STATE:
                node = nodes[batch.sender] = {"state": x[1], "url": x[2], "started": x[3],
                                              **x[4]}
                if offset is not None:  # its wall clock minus this machine's (+ transit)
                    node["clock_offset_s"] = round(offset, 3)
                    node["clock_refused"] = refused
    if unopened and not nodes:
        raise UnopenedError(
            f"heard {unopened} batches on {namespace}:ctrl, none of which opened"
            + (" with the keys given" if sealer is not None else "")
            + ": the bus is sealed; give the cluster's keys with --config (a node's file, "
            "or the one `rpcbus cluster up` prints)")
    return nodes


class UnopenedError(ValueError):
    """Batches were heard on the control topic but none could be read."""


def _stayed(node: dict[str, Any]) -> str:
    """The share of its callers' calls that went to a provider on the node (first
    attempts, since it started), or "-" before any."""
    local, remote = node.get("local_calls", 0), node.get("remote_calls", 0)
    return f"{local / (local + remote):.0%}" if local + remote else "-"


def render(nodes: dict[str, dict[str, Any]]) -> str:
    if not nodes:
        return "no node heard on this Redis and namespace"
    lines = [f"{'node':<12} {'state':<12} {'url':<28} {'uptime':>8} {'conns':>6} "
             f"{'providers':>9} {'in flight':>9} {'stayed local':>12}"]
    by_rpc: dict[str, dict[str, int]] = {}
    for name in sorted(nodes):
        n = nodes[name]
        providers = n.get("providers", {})
        for rpc, count in providers.items():
            by_rpc.setdefault(rpc, {})[name] = count
        lines.append(f"{name:<12} {n['state']:<12} {n['url']:<28} {n.get('uptime_s', 0):>7.0f}s "
                     f"{n.get('connections', 0):>6} "
                     f"{n.get('providers_total', sum(providers.values())):>9} "
                     f"{n.get('pending', 0):>9} {_stayed(n):>12}")
    for name in sorted(nodes):  # synced clocks agree within milliseconds
        offset = nodes[name].get("clock_offset_s")
        if offset is not None and abs(offset) >= CLOCK_WARN_S:
            lines.append(f"{name}: its clock is {offset:+.1f} s off this machine's"
                         + (", beyond cluster.max_skew: its messages are refused"
                            if nodes[name].get("clock_refused") else
                            " (nodes refuse messages beyond cluster.max_skew)")
                         + "; sync the clocks (NTP)")
        shown = len(nodes[name].get("providers", {}))
        more = nodes[name].get("rpcs", shown) - shown
        if more > 0:
            lines.append(f"{name}: {more} more rpcs provided than its heartbeat lists "
                         f"(see its /metrics)")
    lines.append("")
    lines.append(f"{'rpc':<32} providers per node")
    for rpc in sorted(by_rpc):
        per = ", ".join(f"{node}: {count}" for node, count in sorted(by_rpc[rpc].items()))
        lines.append(f"{rpc:<32} {per}")
    return "\n".join(lines)
