"""A node's cluster settings (``[cluster]`` in the node's TOML, read by rpcbus.broker.config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ClusterSection:
    redis_url: str = ""             # empty: a standalone node
    namespace: str = "rpcbus"
    heartbeat_interval: float = 1.0
    heartbeat_misses: int = 3
    provider_cache_ttl: float = 60.0
    negative_ttl: float = 1.0
    query_timeout: float = 0.25
    handover_wait: float = 2.0      # s calls wait for the names of a node stopping as planned
    handover_wait_max: float = 10.0  # s the same at most, as it follows how long moves take
    evacuate_after: float = 3.0     # s the bus may be down before clients are sent elsewhere
    policy: str = "local-first"     # or "cluster": broker/choice.py, docs/cluster.md
    prefer_local: bool = False
    affinity: int = 32              # a frame's calls of a name per draw of their target
    redis_tls_ca: str = ""
    seal: str = ""                  # "none", "sign", "encrypt"; "": none on loopback only
    key_id: str = ""
    keys: dict[str, Any] = field(default_factory=dict)
    max_skew: float = 30.0
    event_max_age: float = 1.0      # s: events heard later than this are shed (docs/events.md)

    # not a setting (no annotation: not a field): set by the config when ``seal`` was not
    # chosen and the URL is on loopback; every Redis the bus uses (the master a Sentinel
    # names, each Redis Cluster node) must then be on loopback too
    loopback_only = False
