"""Silence: a node that stopped writing its history while the others went on, or a provider
that stopped being seen while its node and its rpc went on (pure; no Spark).

- **node**: its last window ends more than ``SILENT_MINUTES`` before the latest of the
  other nodes' last windows, each moved back by its clock offset where one was measured
  (``clock_skew``): a node whose clock is an hour behind is not an hour silent.
- **provider**: served by nodes that write presence rows (so a connected provider has a
  row every window, calls or not), its last row more than ``SILENT_MINUTES`` before its
  nodes' own newest minute, while its rpc still had calls from other providers after.
  Providers named by their session (``s123``: no AUTH name) are left out: each
  reconnect gives them a new name, so every reconnect would look like a silence.

Each finding: ``kind``, ``name``, ``rpc`` (providers), ``node`` (its serving nodes for a
provider), ``since`` (the end of its last window, on its own node's clock) and
``silent_s`` (how much longer the others went on).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rpcbus.analytics.findings import Rpc

SILENT_MINUTES = 5
SCHEMA = "kind STRING, name STRING, rpc STRING, node STRING, since DOUBLE, silent_s DOUBLE"
_SESSION_NAME = re.compile(r"s\d+")


def nodes(last: dict[str, float], offsets: dict[str, float]) -> list[dict[str, Any]]:
    """``last``: per node, the end of its last window; ``offsets``: the measured clock
    offsets (seconds ahead) of the nodes that have one."""
    true_end = {n: t - offsets.get(n, 0.0) for n, t in last.items()}
    out = []
    for node, end in sorted(true_end.items()):
        others = [t for n, t in true_end.items() if n != node]
        if others and max(others) - end > 60 * SILENT_MINUTES:
            out.append({"kind": "node", "name": node, "rpc": None, "node": node,
                        "since": last[node], "silent_s": max(others) - end})
    return out


def providers(arranged: list[Rpc]) -> list[dict[str, Any]]:
    """The providers of ``arranged`` (findings.py ``Rpc``s) that went silent."""
    out = []
    for r in arranged:
        has = r.grid["has"] > 0
        called = r.grid["calls"] > 0
        for i, p in enumerate(r.providers):
            if not r.exact[i] or _SESSION_NAME.fullmatch(p) or not has[i].any():
                continue
            last = int(r.minutes[np.flatnonzero(has[i])[-1]])
            gap = int(r.newest[i]) - last
            others_after = np.delete(called, i, axis=0)[:, r.minutes > last]
            if gap > 60 * SILENT_MINUTES and others_after.any():
                out.append({"kind": "provider", "name": p, "rpc": r.name,
                            "node": ",".join(r.served_by[i]), "since": float(last + 60),
                            "silent_s": float(gap)})
    return out
