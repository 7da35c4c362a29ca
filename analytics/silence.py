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

- **moved**: a silent node whose named providers, half of them or more, carry on on
  another node that began within ``SILENT_MINUTES`` of its end (the node was renamed, or
  replaced under a new name): ``moved_to`` names that node, ``moved_at`` its first
  window's start (on its own clock). Its providers are not silent (their rows go on).

Each finding: ``kind``, ``name``, ``rpc`` (providers), ``node`` (its serving nodes for a
provider), ``since`` (the end of its last window, on its own node's clock),
``silent_s`` (how much longer the others went on), ``moved_to`` and ``moved_at``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rpcbus.analytics.findings import Rpc

SILENT_MINUTES = 5
SCHEMA = ("kind STRING, name STRING, rpc STRING, node STRING, since DOUBLE, silent_s DOUBLE, "
          "moved_to STRING, moved_at DOUBLE")
_SESSION_NAME = re.compile(r"s\d+")


def nodes(spans: dict[str, tuple[float, float]], offsets: dict[str, float],
          carried: dict[str, set[str]]) -> list[dict[str, Any]]:
    """``spans``: per node, the start of its first window and the end of its last;
    ``offsets``: the measured clock offsets (seconds ahead) of the nodes that have one;
    ``carried``: per node, the named providers it served (``named``)."""
    true = {n: (a - offsets.get(n, 0.0), b - offsets.get(n, 0.0)) for n, (a, b) in spans.items()}
    out = []
    for node, (_, end) in sorted(true.items()):
        others = [t for n, (_, t) in true.items() if n != node]
        if not others or max(others) - end <= 60 * SILENT_MINUTES:
            continue
        found: dict[str, Any] = {"kind": "node", "name": node, "rpc": None, "node": node,
                                 "since": spans[node][1], "silent_s": max(others) - end,
                                 "moved_to": None, "moved_at": None}
        mine = carried.get(node, set())
        heirs = [(len(mine & carried.get(n, set())), n) for n, (start, _) in true.items()
                 if n != node and abs(start - end) <= 60 * SILENT_MINUTES]
        shared, heir = max(heirs, default=(0, ""))
        if mine and 2 * shared >= len(mine):
            found.update(moved_to=heir, moved_at=spans[heir][0])
        out.append(found)
    return out


def named(arranged: list[Rpc]) -> dict[str, set[str]]:
    """Per serving node, the providers it served that carry a name of their own (not a
    session's: those change at every reconnect)."""
    out: dict[str, set[str]] = {}
    for r in arranged:
        for p, served in zip(r.providers, r.served_by, strict=True):
            if not _SESSION_NAME.fullmatch(p):
                for node in served:
                    out.setdefault(node, set()).add(p)
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
                            "silent_s": float(gap), "moved_to": None, "moved_at": None})
    return out
