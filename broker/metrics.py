"""``GET /metrics``: the node's counters in Prometheus text format (prometheus-client).

Nothing is counted through prometheus-client on the hot path: the router,
sessions, gate and cluster link keep plain counters (docs/architecture.md), and
this collector turns a snapshot of them into metric families at scrape time.
Names and labels are listed in docs/operations.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rpcbus import __version__
from rpcbus.schema import BOUNDS

if TYPE_CHECKING:
    from rpcbus.broker.node import Node

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# router counters exported one metric each: name -> help
_ROUTER = {
    "ack_timeouts": "Attempts given up because the provider did not accept in time.",
    "ack_checks": "Node attempts with no ACK in time that were checked with the node.",
    "response_timeouts": "Calls that ended RESPONSE_TIMEOUT.",
    "retries": "Calls moved to another provider.",
    "rejects": "REJECTs from providers or nodes.",
    "provider_gone": "Calls that ended PROVIDER_GONE.",
    "late": "Answers for attempts no longer pending (dropped).",
    "foreign": "Answers from a peer the attempt was not given to (dropped).",
    "discarded": "Outcomes for callers already gone (dropped).",
    "cancelled": "INVOKEs cancelled by their origin node.",
    "parked": "Calls that waited for provider discovery.",
    "parts": "Stream parts passed on to their callers.",
    "stream_overruns": "Streams ended because their provider sent past its credit.",
    "parts_lost": "Streams ended because a part from another node was lost on the bus.",
    "overloaded": "Calls that ended OVERLOADED: shed, or no free slot in time (not run).",
    "waited": "Calls that waited for a free slot at a provider or node.",
    "shed": "Calls shed on arrival OVERLOADED: their name's waits stood over target.",
    "busy": "Attempts a provider or node turned away unrun: full (BUSY) or read late.",
    "fanout_refused": "call_alls refused LIMIT_EXCEEDED: more providers than limits.max_fanout.",
    "bus_waits": "Attempts at other nodes that waited through a reset of this node's bus.",
    "answers_lost": "Calls that ended CLUSTER_UNAVAILABLE: a node ran them, their answer "
                    "was lost on the bus.",
    "handed_back": "Calls a draining node refused SHUTTING_DOWN (not run): their callers "
                   "send them to another node.",
}
# node I/O counters: name -> help
_IO = {
    "messages_in": "Client messages received.",
    "frames_in": "Client frames received.",
    "frames_out": "Frames sent to clients.",
    "messages_out": "Messages sent to clients.",
    "dropped_out": "Messages for clients dropped (connection gone, unencodable).",
    "invalid_messages": "Malformed client messages (answered INVALID_MESSAGE).",
    "closed_for_garbage": "Connections closed after too many invalid messages.",
    "rate_limited": "Requests refused RATE_LIMITED.",
    "permission_denied": "Requests refused PERMISSION_DENIED.",
    "slow_consumers": "Connections closed for not reading.",
    "reads_paused": "Times a connection hit its in-flight limit (backpressure).",
    "connections": "Connections accepted.",
    "connections_held": "Connections read only after a wait: their address's logins "
                        "failed or it flooded lately.",
    "handshakes_too_large": "Upgrade requests over limits.max_handshake_bytes (HTTP 431).",
    "closed_before_auth": "Connections closed for sending over limits.max_bytes_before_auth "
                          "before AUTH completed.",
    "closed_for_control_frames": "Connections closed for sending over "
                                 "limits.max_control_frames WebSocket pings or pongs.",
}


class _NodeCollector:
    def __init__(self, node: "Node") -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        snap = node.snapshot()
        yield _gauge("rpcbus_up", "1 while the node serves, 0 while starting or draining.",
                     1 if snap["state"] == "ready" else 0)
        yield _gauge("rpcbus_connections", "Open client connections.", snap["sessions"])
        yield _gauge("rpcbus_pending_calls", "Calls routed by this node, not yet ended.",
                     snap["pending"])
        providers = GaugeMetricFamily("rpcbus_providers", "Local providers per rpc.",
                                      labels=["rpc"])
        for rpc, count in snap["providers"].items():
            providers.add_metric([rpc], count)
        yield providers

        calls = CounterMetricFamily("rpcbus_calls", "Calls ended, by rpc and outcome code "
                                    "(ok or an error code), on the caller's node.",
                                    labels=["rpc", "outcome"])
        latency = HistogramMetricFamily("rpcbus_call_duration_seconds",
                                        "Time from REQUEST to outcome, on the caller's node, "
                                        "by rpc and outcome (every call: its count is "
                                        "rpcbus_calls_total's).", labels=["rpc", "outcome"])
        for rpc, stats in list(node.router.rpc_stats.by_name.items()):
            for code, n in list(stats.outcomes.items()):
                calls.add_metric([rpc, code], n)
            for code, (counts, total) in stats.histograms().items():
                cumulative, buckets = 0, []
                for bound, n in zip((*map(str, BOUNDS), "+Inf"), counts, strict=True):
                    cumulative += n
                    buckets.append((bound, cumulative))
                latency.add_metric([rpc, code], buckets, total)
        yield calls
        yield latency

        router = snap["router"]
        for name, text in _ROUTER.items():
            yield _counter(f"rpcbus_{name}", text, router.get(name, 0))
        io = snap["io"]
        for name, text in _IO.items():
            yield _counter(f"rpcbus_{name}", text, io.get(name, 0))
        auth = snap["auth"]
        yield _counter("rpcbus_auth_failures", "Failed AUTH attempts.",
                       auth.get("auth_failures", 0))
        yield _counter("rpcbus_auth_refused_connections", "Connections refused at AUTH "
                       "for the user's connection cap.", auth.get("connections_refused", 0))
        yield _counter("rpcbus_logins_busy", "Logins answered BUSY (not checked: the "
                       "password queue was full, room was made for another address, or "
                       "the CPU budget of failing logins was spent).",
                       auth.get("logins_busy", 0))
        yield _counter("rpcbus_token_refusals_remembered", "JWT logins refused from "
                       "memory (the same token refused in the last minute: not verified "
                       "again).", auth.get("token_refusals_remembered", 0))
        refused = CounterMetricFamily("rpcbus_connections_refused", "TCP connections refused "
                                      "before the handshake, by HTTP status (429: the "
                                      "address's limits, 503: the node's).", labels=["status"])
        for status in ("429", "503"):
            refused.add_metric([status], auth.get(f"connections_refused_{status}", 0))
        yield refused

        history = snap["history"]
        if history is not None:
            yield _counter("rpcbus_history_rows_written", "Load-history rows written.",
                           history["rows_written"])
            yield _counter("rpcbus_history_rows_dropped", "Load-history rows dropped "
                           "(writer queue full or disk errors).", history["rows_dropped"])
            yield _gauge("rpcbus_history_writer_lag_seconds", "How long the last window's rows "
                         "waited for the writer thread.", history["writer_lag_s"])
        weights = snap["weights"]
        if weights is not None:
            yield _counter("rpcbus_weights_reloads", "Times a changed weights file was "
                           "loaded.", weights["reloads"])
            yield _counter("rpcbus_weights_reload_errors", "Times a changed weights file "
                           "could not be used (the previous weights stayed).",
                           weights["reload_errors"])
        cluster = snap["cluster"]
        if cluster is not None:
            yield from _cluster(cluster)


def _cluster(cluster: dict[str, Any]) -> Iterator[Metric]:
    bus = cluster["bus"]
    yield _gauge("rpcbus_cluster_available", "1 while the cluster bus (Redis) works.",
                 1 if cluster["available"] else 0)
    yield _gauge("rpcbus_cluster_members", "Other nodes heard from.", len(cluster["members"]))
    for what in ("messages", "batches"):
        family = CounterMetricFamily(f"rpcbus_bus_{what}", f"Cluster bus {what} "
                                     "(a batch is one PUBLISH).", labels=["direction"])
        family.add_metric(["in"], bus[f"{what}_in"])
        family.add_metric(["out"], bus[f"{what}_out"])
        yield family
    rejected = CounterMetricFamily("rpcbus_bus_rejected", "Cluster batches and messages "
                                   "dropped unread, by reason.", labels=["reason"])
    for reason, n in cluster["bus_rejected"].items():
        rejected.add_metric([reason], n)
    rejected.add_metric(["malformed_batch"], bus["bad_batches"])
    rejected.add_metric(["malformed_message"], bus["bad_messages"])
    yield rejected
    for name, (value, text) in {
        "bus_reconnects": (bus["reconnects"], "Cluster bus sessions lost (Redis reconnects)."),
        "bus_dropped": (bus["dropped"], "Cluster messages dropped while the bus was down."),
        "provider_cache_lookups": (cluster["cache_lookups"], "Provider cache lookups."),
        "provider_cache_misses": (cluster["cache_misses"], "Provider cache misses."),
        "provider_queries": (cluster["queries_sent"], "Provider queries sent to the cluster."),
        "stale_invokes": (cluster["stale_invokes"], "INVOKEs refused unrun as too late."),
        "nodes_dead": (cluster["nodes_dead"], "Nodes declared dead (silent, unannounced)."),
        "nodes_left": (cluster["nodes_left"], "Nodes that stopped as planned (terminating)."),
    }.items():
        yield _counter(f"rpcbus_{name}", text, value)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


def render(node: "Node") -> bytes:
    """The node's metrics now, in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_NodeCollector(node))
    # the process (CPU, memory, open files), the interpreter and its GC, and the build
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    build = GaugeMetricFamily("rpcbus_build_info", "The running rpcbus: 1, by version.",
                              labels=["version"])
    build.add_metric([__version__], 1)
    registry.register(_Fixed([build]))
    return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
