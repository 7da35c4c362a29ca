"""What a node tells about itself, read from its tables and never changing them: the
figures of its heartbeat (``heartbeat``), ``/cluster`` (``cluster_view``), ``/stats``
and the Prometheus metrics (``snapshot``), and DISCOVER's answer (``discover``).
broker/node.py holds the tables; these only read them, so they raise nothing of their
own and a request for them never waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable

from rpcbus.broker import discovery

if TYPE_CHECKING:
    from rpcbus.broker.node import Node
    from rpcbus.broker.session import Session

HEARTBEAT_RPCS = 100  # rpcs whose provider counts a heartbeat carries
HEARTBEAT_RPC_CALLS = 20  # rpcs whose call counts and latency buckets it carries


def heartbeat(node: Node) -> dict[str, Any]:
    """What this node tells the cluster in every heartbeat (``rpcbus status``, the
    dashboard): its load, its callers' calls so far (ended ok / with an error: a call
    that crosses nodes is counted once, on its caller's node), and the
    provider counts of at most HEARTBEAT_RPCS rpcs (the most provided) with the
    totals, and the call counts and latency buckets of its callers' HEARTBEAT_RPC_CALLS
    busiest rpcs (the dashboard's per-rpc rates and percentiles), how many of its
    callers' calls went to a provider here or to another node, and the attempts
    outstanding at its providers of the HEARTBEAT_RPCS busiest rpcs (``load``, which
    other nodes' ``local-first`` choice weighs; routing reads nothing else here: it
    learns counts from PROVIDER_UPDATE and RPC_QUERY), and the digest of the users
    logged in here (broker/presence.py: another node whose view disagrees asks for
    the whole set). A heartbeat stays small however many names are provided or
    called, or users logged in."""
    stats = node.router.stats
    counts = node.router.provider_counts()
    shown = counts if len(counts) <= HEARTBEAT_RPCS else dict(
        sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:HEARTBEAT_RPCS])
    figures = node.router.figures
    return {"connections": len(node.sessions), "pending": node.router.pending,
            "uptime_s": round(time.time() - node.started, 1),
            "providers": shown, "rpcs": len(counts),
            "providers_total": sum(counts.values()),
            "calls_ok": stats.calls_ok, "calls_failed": stats.calls_failed,
            "local_calls": stats.local_calls, "remote_calls": stats.remote_calls,
            "served": (served := figures.rates(HEARTBEAT_RPCS)),
            "latency": figures.latencies(served),
            "calls_by_rpc": (busiest := node.router.rpc_stats.busiest(HEARTBEAT_RPC_CALLS)),
            "errors_by_rpc": node.router.rpc_stats.errors_of(list(busiest)),
            "provider_view": figures.view(list(shown)[:HEARTBEAT_RPC_CALLS],
                                          node.router.now),
            "presence": node.presence.digest()}

def discover(node: Node, name: str | None, may_call: Callable[[str], bool]) -> Any:
    """DISCOVER's answer (broker/discovery.py): every name the user may call, with its
    providers per node; or ``name``'s providers across the cluster."""
    members = {} if node.link is None else {
        node: member.info for node, member in node.link.membership.members.items()}
    told = {node: info.get("providers") or {} for node, info in members.items()}
    if name is None:
        cached = {} if node.link is None else {
            rpc: dict(entry.counts) for rpc, entry in node.link.core.cache.entries.items()}
        return discovery.rpcs(node.name, node.router.provider_counts(), told, cached,
                              may_call)
    weights = node.router.draws.weights
    counts = {node: told[node].get(name, 0) for node in members}
    if node.link is not None and (entry := node.link.core.cache.entries.get(name)):
        counts.update({node: n for node, n in entry.counts.items() if node in counts})
    here = node.router.figures.view([name], node.router.now, most=1000).get(name, [])
    return discovery.providers(
        name, node.name, here,
        {node: info.get("provider_view") or {} for node, info in members.items()},
        counts, (lambda p: weights.of(name, p)) if weights is not None else lambda p: 1.0)

def cluster_view(node: Node) -> dict[str, Any]:
    """This node and every node it hears, with their last heartbeat (``/cluster``)."""
    nodes = {node.name: {"state": node.state, "url": node.url,
                         **heartbeat(node)}}
    if node.link is not None:
        for name, member in node.link.membership.members.items():
            nodes[name] = {"state": member.state, "url": member.url, **member.info}
    return {"node": node.name, "time": time.time(), "nodes": nodes,
            "cluster": node.link is not None,
            "bus": "up" if node.link is None or node.link.available else "down"}


def snapshot(node: Node) -> dict[str, Any]:
    """Counters for /stats and the benchmarks: outcomes, drops, frames and messages."""
    totals = Counter(node.closed_totals)
    for s in node.sessions:
        totals.update(session_counters(s))
    return {
        "node": node.name,
        "url": node.url,
        "state": node.state,
        "uptime_s": round(time.time() - node.started, 3),
        "sessions": len(node.sessions),
        "pending": node.router.pending,
        "timers": node.router.timers,
        "tasks": len(asyncio.all_tasks()),
        "providers": node.router.provider_counts(),
        "router": node.router.stats.as_dict(),
        "admission": node.router.admission(),
        "io": {**dict(node.stats), **dict(totals)},
        "auth": dict(node.gate.stats),
        "connections": {"open": node.gate.open, "logging_in": node.gate.waiting,
                        "max": node.gate.max_connections,
                        "addresses": len(node.gate.by_address)},
        "history": None if node.history is None else {
            "rows_written": node.history.writer.written,
            "rows_dropped": node.history.writer.dropped,
            "writer_lag_s": round(node.history.writer.lag_s, 6)},
        "cluster": node.link.snapshot() if node.link is not None else None,
        "events": {**dict(node.events.stats), "topics": len(node.events.subscribers),
                   "channels": len(node.events.channels)},
        "presence": {**dict(node.presence.stats), "here": len(node.presence.local),
                     "online": len(node.presence.where),
                     "watchers": len(node.presence.watching)},
        "weights": None if node.weights_file is None else {
            "file": node.weights_file.path, "rpcs": len(node.weights_file.weights.rpcs),
            "reloads": node.weights_file.reloads,
            "reload_errors": node.weights_file.reload_errors},
    }


_SESSION_COUNTERS = ("frames_in", "frames_out", "messages_out", "dropped_out")


def session_counters(session: Session) -> dict[str, int]:
    """A session's frame and message counters (summed over live and closed sessions)."""
    return {name: getattr(session, name) for name in _SESSION_COUNTERS}
