"""What a node measures of its providers, for choosing among them and for telling the
cluster. Pure: no I/O; time comes in as ``now``.

The router (broker/router.py) keeps each provider peer's ``load``, ``attempts`` and, as
timed attempts end, ``lat`` and ``seen``; ``ProviderFigures`` turns them into:

- ``rate`` (attempts sent per second) and ``steady`` (``lat`` smoothed), sampled every
  ``RATE_SAMPLE`` s under ``local-first`` (``sample``): what broker/choice.py weighs;
- each provider's last minute per rpc (``MinuteStats``, broker/discovery.py), moved on
  every ``HALF`` (``rotate``);
- what a heartbeat tells the other nodes (``rates``, ``latencies``, ``view``), and
  ``rates_moved`` when the rates moved far from what it last told (the cluster core
  then sends the next heartbeat early).

It reads the router's own tables (``providers`` by name, the provider ``peers``, the
attempts ``calls``), which the router keeps and never replaces.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

from rpcbus.broker.choice import QUIET
from rpcbus.broker.discovery import HALF

if TYPE_CHECKING:
    from rpcbus.broker.calls import Call
    from rpcbus.broker.peers import Peer

RATE_SAMPLE = 0.05  # s between samples of the providers' call rates (``rate``)
RATE_STEP = 0.05    # of the way to each sample: smoothed over about a second
OUTSTANDING_AGE = 0.5  # s a count of attempts under way per (provider, rpc) is reused
LAT_IDLE = 0.9      # an idle provider's ``lat`` per sample: a slow one is tried again
# ``steady``: of the way to ``lat`` per sample, so over about a quarter second: a stall of
# a few ms (a busy machine, a GC pause) that lifts ``lat`` at once barely moves it
STEADY_STEP = 0.2


class ProviderFigures:
    """The figures of one node's providers (the module's docstring says which)."""

    __slots__ = ("_calls", "_outstanding", "_outstanding_at", "_peers", "_providers",
                 "_sent_then", "_told", "rates_moved", "rotated", "sampled")

    def __init__(self, providers: dict[str, list[Peer]], peers: set[Peer],
                 calls: dict[int, Call], now: float) -> None:
        self._providers = providers  # the router's: name -> its providers here
        self._peers = peers          # the router's: peers that ever provided
        self._calls = calls          # the router's: attempt id -> call
        self.sampled = now  # when the providers' rates were last sampled (``sample``)
        self.rotated = now  # when the providers' last minutes last moved on (``rotate``)
        # attempts under way per (provider, rpc), as last counted (``held_by_rpc``)
        self._outstanding: Counter[tuple[Peer, str]] = Counter()
        self._outstanding_at = -1e18
        # the local providers' summed rate when a heartbeat last told it (``rates``)
        self._told = 0.0
        self.rates_moved = False  # a heartbeat is due early (the cluster core reads it)
        # each provider's ``attempts`` and attempts ended at the last sample
        self._sent_then: dict[Peer, tuple[int, int]] = {}

    def forget(self, peer: Peer) -> None:
        """``peer`` left: no sample of it is kept."""
        self._sent_then.pop(peer, None)

    def sample(self, now: float) -> None:
        """``RATE_SAMPLE`` passed (``local-first``): each provider's ``rate`` moves
        ``RATE_STEP`` of the way to the rate of attempts sent to it since the last sample;
        a local provider that ended no attempt while holding some gets the sample's span
        added to its ``lat`` (timed attempts move it as they end), an idle one's shrinks
        by ``LAT_IDLE``, so a slow provider left alone is tried again (its ``seen`` stays:
        what other nodes are told); its ``steady`` moves ``STEADY_STEP`` of the way to its
        ``lat``. When the local providers' rates moved by more than ``QUIET`` and half
        from what the last heartbeat told, ``rates_moved`` asks for one early."""
        seen, span = self._sent_then, now - self.sampled
        assert span > 0, "sampled twice at one time"
        self.sampled = now
        serving = 0.0
        for peer in self._peers:
            sent, load = peer.attempts, peer.load
            ended = sent - load
            then = seen.get(peer)
            seen[peer] = (sent, ended)
            if then is None:
                continue        # new: measured from the next sample on
            sent0, ended0 = then
            peer.rate += RATE_STEP * ((sent - sent0) / span - peer.rate)
            if peer.is_node:
                continue        # a node reports its providers' own (``latency``)
            serving += peer.rate
            if load:
                if ended == ended0:  # holding attempts, none ended: it may be stuck
                    peer.lat += span
            else:
                peer.lat *= LAT_IDLE
            peer.steady += STEADY_STEP * (peer.lat - peer.steady)
        told = self._told
        if abs(serving - told) > max(QUIET, told / 2):
            self.rates_moved = True   # the other nodes weigh what they were told

    def rotate(self, now: float) -> None:
        """Each provider's last minute moves on (``HALF`` passed)."""
        assert now >= self.rotated + HALF, "rotated early"
        self.rotated = now
        held = self.held_by_rpc(now, fresh=True)
        for peer in self._peers:
            if peer.minutes is not None:
                for name, stat in peer.minutes.items():
                    stat.rotate(held[peer, name])

    def rates(self, most: int) -> dict[str, float]:
        """Calls per second this node sends its providers, by rpc: the ``most`` busiest
        (other nodes' ``local-first`` choice weighs them, a heartbeat old)."""
        rates = {name: round(n, 1) for name, peers in self._providers.items()
                 if (n := sum(p.rate for p in peers)) >= 0.05}
        self._told = sum(p.rate for p in self._peers if not p.is_node)
        self.rates_moved = False
        if len(rates) > most:
            rates = dict(sorted(rates.items(), key=lambda kv: -kv[1])[:most])
        return rates

    def latencies(self, names: Iterable[str]) -> dict[str, float]:
        """Per rpc of ``names`` provided here, the seconds an attempt took at its fastest
        provider that has any measure (``seen``: as last measured, not shrunk while
        idle, so other nodes stay off a slow provider until this node finds it quick
        again): other nodes' ``local-first`` choice weighs it, a heartbeat old."""
        out = {}
        for name in names:
            lats = [p.seen for p in self._providers.get(name, ()) if p.seen > 0]
            if lats:
                out[name] = round(min(lats), 5)
        return out

    def view(self, names: Iterable[str], now: float, most: int = 8
             ) -> dict[str, list[list[Any]]]:
        """Per rpc of ``names`` provided here, up to ``most`` of its providers (the busiest
        first), each with its figures for that rpc alone (``MinuteStats.figures``):
        [name, calls/s, ms an attempt takes, attempts outstanding, and over about the
        last minute calls, errors, p50 ms, p99 ms, then its label (name@session, as
        call_all's replies name it)], for the dashboard and discovery."""
        out = {}
        rotated = self.rotated
        held = self.held_by_rpc(now)
        for name in names:
            peers = self._providers.get(name)
            if peers:
                rows = []
                for p in peers:
                    stat = p.minutes.get(name) if p.minutes is not None else None
                    rows.append([p.provider_name,
                                 *(stat.figures(now, rotated, held[p, name])
                                   if stat is not None else (0.0, 0.0, 0, 0, 0, None, None)),
                                 p.label])
                rows.sort(key=lambda row: -row[4])  # the most calls first
                out[name] = rows[:most]
        return out

    def held_by_rpc(self, now: float, fresh: bool = False) -> Counter[tuple[Peer, str]]:
        """Attempts under way per (provider here, rpc): counted from the attempts table
        when figures are read, not kept per call; a count up to ``OUTSTANDING_AGE`` old
        is reused (``fresh``: never), so DISCOVERs cost a pass over the attempts at most
        twice a second however many come."""
        if not fresh and now - self._outstanding_at < OUTSTANDING_AGE:
            return self._outstanding
        held: Counter[tuple[Peer, str]] = Counter()
        for call in self._calls.values():
            peer = call.provider
            if peer is not None and peer.minutes is not None:
                held[peer, call.name] += 1
        self._outstanding, self._outstanding_at = held, now
        return held


def failed_at(peer: Peer, call: Call) -> None:
    """``call``'s attempt at ``peer`` failed (an error, or no answer in time): one error
    in the provider's figures for the name."""
    minutes = peer.minutes
    if minutes is not None and (stat := minutes.get(call.name)) is not None:
        stat.errors += 1
