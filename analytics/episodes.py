"""Episodes: the stretches of minutes in which a provider was slow or failing against the
other providers of its rpc in the same minutes (numpy on the driver;
docs/history.md has the rules).

Minute by minute, per rpc and provider (all serving nodes together), against the median
of the rpc's *other* providers that minute:

- **slow**: its mean latency (over at least ``MIN_SAMPLED`` sampled calls) is over
  ``findings.SLOW_FACTOR`` times the others' median mean latency;
- **failing**: at least ``MIN_FAILED`` calls failed (errors and timeouts), and its failure
  rate is at least ``findings.FAIL_MARGIN`` above and ``findings.FAIL_FACTOR`` times the
  others' median.

Bad minutes at most ``GAP`` minutes apart form one episode (a quiet or borderline minute
inside does not end it); an episode of fewer than ``MIN_MINUTES`` bad minutes is noise
and left out. Each episode says when (``start``, ``end``: the end of its last bad
minute), how long, how bad (``value``: its mean latency or failure rate over the bad
minutes, ``peers_value``: the median of the others' figure over them, ``factor``), the
calls it touched (``affected``: every call of a slow episode, the failed calls over the
peers' rate of a failing one) and whether it was still going at the end of the history
(``ongoing``: its last bad minute within ``GAP`` minutes of the newest minute of the
provider's serving nodes: each node's own timeline, ``Rpc.newest``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rpcbus.analytics.series import median, others_median, ratio

if TYPE_CHECKING:
    from rpcbus.analytics.findings import Rpc

GAP = 2            # minutes: bad minutes this close are one episode
MIN_MINUTES = 3    # bad minutes an episode needs
MIN_SAMPLED = 3    # sampled calls a minute needs to be judged slow
MIN_FAILED = 3     # failed calls a minute needs to be judged failing
SCHEMA = ("rpc STRING, provider STRING, kind STRING, start BIGINT, end BIGINT, "
          "minutes BIGINT, bad_minutes BIGINT, calls BIGINT, failed BIGINT, value DOUBLE, "
          "peers_value DOUBLE, factor DOUBLE, affected DOUBLE, ongoing BOOLEAN")


def episodes(arranged: list[Rpc]) -> list[dict[str, Any]]:
    """The episodes of every rpc (analytics/findings.py ``arrange``)."""
    from rpcbus.analytics.findings import FAIL_FACTOR, FAIL_MARGIN, SLOW_FACTOR

    out = []
    for r in arranged:
        g = r.grid
        # per provider and minute, against the median of the rpc's other providers with
        # a figure that minute
        latency = np.where(g["has"] > 0, ratio(g["lat_sum"], g["sampled"]), np.nan)
        failure = np.where(g["has"] > 0, ratio(g["failed"], g["calls"]), np.nan)
        peers_latency, _ = others_median(latency)
        peers_failure, _ = others_median(failure)
        with np.errstate(invalid="ignore"):
            slow = ((g["sampled"] >= MIN_SAMPLED) & (peers_latency > 0)
                    & (latency > SLOW_FACTOR * peers_latency))
            failing = ((g["failed"] >= MIN_FAILED) & ~np.isnan(peers_failure)
                       & (failure >= peers_failure + FAIL_MARGIN)
                       & (failure >= FAIL_FACTOR * peers_failure))
        for kind, bad, peers in (("slow", slow, peers_latency),
                                 ("failing", failing, peers_failure)):
            for i in np.flatnonzero(bad.any(axis=1)):
                for run in _runs(r.minutes, np.flatnonzero(bad[i])):
                    out.append(_episode(r, int(i), run, kind, peers[i, run]))
    return out


def _runs(minutes: np.ndarray, at: np.ndarray) -> list[np.ndarray]:
    """The columns ``at`` (bad minutes, ascending) split where their minutes are more
    than ``GAP`` minutes apart; runs of fewer than ``MIN_MINUTES`` left out."""
    breaks = np.flatnonzero(np.diff(minutes[at]) > 60 * GAP + 60) + 1
    return [run for run in np.split(at, breaks) if len(run) >= MIN_MINUTES]


def _episode(r: Rpc, i: int, run: np.ndarray, kind: str,
             peers: np.ndarray) -> dict[str, Any]:
    """One episode: provider ``i`` of ``r`` over the columns ``run``, ``peers`` the
    others' median figure in each of them."""
    g = r.grid
    calls, failed = g["calls"][i, run].sum(), g["failed"][i, run].sum()
    value = (g["lat_sum"][i, run].sum() / g["sampled"][i, run].sum() if kind == "slow"
             else failed / calls)
    peers_value = median(peers.tolist())
    start, end = int(r.minutes[run[0]]), int(r.minutes[run[-1]]) + 60
    return {"rpc": r.name, "provider": r.providers[i], "kind": kind, "start": start,
            "end": end, "minutes": (end - start) // 60, "bad_minutes": len(run),
            "calls": calls, "failed": failed, "value": value, "peers_value": peers_value,
            "factor": value / peers_value if peers_value else None,
            "affected": calls if kind == "slow" else max(0.0, failed - peers_value * calls),
            "ongoing": end - 60 >= int(r.newest[i]) - 60 * GAP}
