"""Provider load history: what each provider was given, per time window, written to disk.

Recorded by the router on the node where the provider is connected (it saw
every attempt), per window of ``history.window`` seconds and per
(rpc, provider, routing node). One row per key and window that had any
activity, and a presence row (no calls, ``peak_in_flight`` 0) per window for each
(rpc, provider) provided here that had none, so the analysis sees a provider that
was given nothing; the schema (``SCHEMA_VERSION``) is in docs/history.md.

Cost on the hot path: an attempt at a provider finds its ``Row`` (one dict
lookup in the provider connection's row cache) and counts its start; an
answer costs nothing unless the attempt is measured, other ends count their
outcome in the row the call keeps. Answers are derived (``Row``), and the
attempts in flight are counted by scanning the router's pending attempts
every ``SCAN_INTERVAL`` seconds (``peak_in_flight`` is the most of those
samples, at least 1 in a window with work; ``provider_peak_in_flight`` the most
of their sums over the routing nodes, the same on each of the window's rows of
the (rpc, provider)). Counts are exact. Some
attempts are measured: one in ``HISTORY_SAMPLE`` (broker/router.py: 16, by
attempt id) and each row's first attempt in a window (so every row with work
has one). Their latency goes into a fixed log-bucket histogram (the bounds of
rpcbus/schema.py, so windows and nodes merge exactly), and their request and
answer payloads are re-encoded with msgpack for their size: ``bytes_in`` /
``bytes_out`` are the mean measured size times the calls (answers), so
estimates, exact for uniform payloads.

Writing never blocks the event loop: ``roll`` hands finished rows to a
``HistoryWriter`` thread through a bounded queue (full: rows are dropped and
counted, never waited for). Files are JSON lines, partitioned
``DIR/date=YYYY-MM-DD/hour=HH/node=NAME/part-<start>-<pid>[-<n>].jsonl``: one file
per node and hour (a new hour rotates to a new file). A batch of rows that cannot
be written (the disk is full) is dropped whole, counted and logged
(``history_write_failed``), and the file cut back to its last whole line: a row is
never torn. ``close`` flushes what is left (graceful shutdown).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from typing import Any, Callable

import structlog
from msgpack import packb

from rpcbus.schema import BOUNDS, OUTCOMES, Outcome, bucket_of
from rpcbus.schema import HISTORY_SCHEMA_VERSION as SCHEMA_VERSION

log = structlog.get_logger(module="rpcbus.history")

SCAN_INTERVAL = 0.1   # s between samples of the attempts in flight (peak_in_flight)


class Row:
    """One (rpc, provider, routing node): counters for the current window.

    Answered attempts are not counted one by one: an attempt ends either as an
    outcome counted here (rejected, errors, timeouts) or answered, so the
    answered ones of a window are the attempts that ended (``started`` plus those
    pending at the window's start, less those pending at its end) less the rest.
    """

    __slots__ = ("key", "started", "pending", "outcomes", "buckets", "lat_sum", "lat_min",
                 "lat_max", "peak", "users", "in_sum", "in_n", "out_sum", "out_n", "in_mean",
                 "out_mean")

    def __init__(self, key: tuple[str, str, str]) -> None:
        self.key = key
        self.pending = 0     # attempts pending at the window's start
        self.users = 0       # provider connections whose row cache holds it
        self.in_mean = self.out_mean = 0.0   # payload bytes per request / answer, last known
        self._reset()

    def _reset(self) -> None:
        self.started = 0                 # attempts given to the provider in this window
        self.outcomes = [0] * len(Outcome)  # by Outcome (OK unused: derived, see above)
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.lat_sum, self.lat_min, self.lat_max = 0.0, float("inf"), 0.0
        self.peak = self.pending         # the most pending seen by ``scan``
        self.in_sum = self.in_n = self.out_sum = self.out_n = 0  # payload sizes measured


class History:
    """The recorder of one node (pure but for ``clock``; ``roll`` is called by the node)."""

    def __init__(self, node: str, window: float, writer: "HistoryWriter | None",
                 now_wall: float, clock: Callable[[], float] = time.perf_counter,
                 policy: str = "cluster") -> None:
        self.node = node
        self.policy = policy   # the node's cluster.policy, on every row (fairness reads it)
        self.window = window
        self.writer = writer
        self.clock = clock
        self.rows: dict[tuple[str, str, str], Row] = {}
        # per (rpc, provider): the most attempts pending at once over all routing nodes
        self.peaks: dict[tuple[str, str], int] = {}
        self.window_start = now_wall - now_wall % window

    # The router records attempts itself, on its hot path (broker/router.py ``_dispatch``
    # finds the row and counts the start, ``_history_end`` counts the end); the rows and
    # their caches on provider connections are kept here.

    def row_for(self, provider: Any, slot: Any) -> Row:
        """The row of ``slot`` (an rpc name, or (name, origin node)) for ``provider``,
        made or shared (two connections with one name share rows) and cached on it."""
        rpc, origin = (slot, self.node) if isinstance(slot, str) else slot
        key = (rpc, provider.provider_name, origin)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = Row(key)
        row.users += 1
        provider.hrows[slot] = row
        return row

    def forget(self, provider: Any) -> None:
        """``provider`` is gone: its rows go once written and no other connection uses them."""
        for row in provider.hrows.values():
            row.users -= 1
        provider.hrows.clear()

    def sample(self, row: Row, data: Any) -> float:
        """A measured attempt starts (one in ``HISTORY_SAMPLE`` by attempt id, and each row's
        first in a window): its request's size now; returns its start for ``observe``."""
        row.in_sum += _size(data)
        row.in_n += 1
        return self.clock()

    def answered(self, row: Row, started: float, data: Any) -> None:
        """A measured attempt was answered with ``data``: its latency and answer size."""
        row.out_sum += _size(data)
        row.out_n += 1
        self.observe(row, started)

    def observe(self, row: Row, started: float) -> None:
        """A sampled attempt's latency, from ``started`` (``clock``) to now."""
        latency = self.clock() - started
        row.buckets[bucket_of(latency)] += 1
        row.lat_sum += latency
        if latency < row.lat_min:
            row.lat_min = latency
        if latency > row.lat_max:
            row.lat_max = latency

    def scan(self, pending: dict[Row, int]) -> None:
        """The attempts pending now per row (``Router.history_pending``): the peaks in
        flight, per row and per (rpc, provider) over its routing nodes. The node calls it
        every ``SCAN_INTERVAL`` seconds."""
        for row, n in pending.items():
            if n > row.peak:
                row.peak = n
        for key, n in _per_provider(pending).items():
            if n > self.peaks.get(key, 0):
                self.peaks[key] = n

    def roll(self, now_wall: float, pending: dict[Row, int], force: bool = False,
             weights: Any = None, provided: Any = None) -> int:
        """Close the window if it is over (or ``force``): hand its rows to the writer.
        ``pending``: the attempts pending now per row (``Router.history_pending``);
        ``weights`` (rpcbus.broker.weights.Weights, or None: all 1) are the weights in use,
        recorded with each row; ``provided``: None, or a function giving the (rpc, provider
        name) pairs provided here now (``Router.provided_pairs``, called only when the
        window closes): one with no row of work in the window gets a presence row (no
        calls, ``peak_in_flight`` 0), so a provider given nothing is seen. Returns how many
        rows were written."""
        end = self.window_start + self.window
        if now_wall < end and not force:
            return 0
        rows = [self._record(row, self.window_start, end, weights, pending.get(row, 0))
                for row in self.rows.values()
                if row.started or row.pending or any(row.outcomes)]
        # the provider's peak over its routing nodes: sampled together, so never less than
        # any one node's, nor than what is pending over all of them now
        peaks, pending_now = self.peaks, _per_provider(pending)
        for key, n in pending_now.items():
            peaks[key] = max(peaks.get(key, 0), n)
        for r in rows:
            pair = (r["rpc"], r["provider"])
            peaks[pair] = max(peaks.get(pair, 0), r["peak_in_flight"])
        for r in rows:
            r["provider_peak_in_flight"] = peaks[(r["rpc"], r["provider"])]
        worked = {(r["rpc"], r["provider"]) for r in rows}
        rows += [self._presence(rpc, provider, self.window_start, end, weights)
                 for rpc, provider in sorted(set(provided() if provided else ()) - worked)]
        for gone in [k for k, r in self.rows.items() if not r.users and r not in pending]:
            del self.rows[gone]  # rows of providers gone leave (once written)
        for row in self.rows.values():
            row.pending = pending.get(row, 0)
            row._reset()
        self.peaks = pending_now  # the next window starts from what is pending now
        self.window_start = now_wall - now_wall % self.window
        if rows and self.writer is not None:
            self.writer.put(rows)
        return len(rows)

    def _record(self, row: Row, start: float, end: float, weights: Any,
                pending: int) -> dict[str, Any]:
        rpc, provider, routed_by = row.key
        others = row.outcomes[Outcome.OK + 1:]
        o = [row.started + row.pending - pending - sum(others), *others]  # answered: see Row
        sampled = sum(row.buckets)
        if row.in_n:
            row.in_mean = row.in_sum / row.in_n
        if row.out_n:
            row.out_mean = row.out_sum / row.out_n
        return {
            "schema_version": SCHEMA_VERSION,
            "window_start": round(start, 3), "window_end": round(end, 3),
            "rpc": rpc, "provider": provider, "served_by": self.node, "routed_by": routed_by,
            "calls": sum(o), **dict(zip(OUTCOMES, o, strict=True)),
            "latency_bounds_s": list(BOUNDS), "latency_buckets": list(row.buckets),
            "latency_sampled": sampled, "latency_sum_s": round(row.lat_sum, 6),
            "latency_min_s": round(row.lat_min, 6) if sampled else None,
            "latency_max_s": round(row.lat_max, 6) if sampled else None,
            "peak_in_flight": max(row.peak, pending, 1),
            "bytes_in": round(row.in_mean * sum(o)),
            "bytes_out": round(row.out_mean * o[Outcome.OK]),
            "weight": 1.0 if weights is None else weights.of(rpc, provider),
            "policy": self.policy,
        }

    def _presence(self, rpc: str, provider: str, start: float, end: float,
                  weights: Any) -> dict[str, Any]:
        """The row of a provided (rpc, provider) that had no work in the window."""
        return {
            "schema_version": SCHEMA_VERSION,
            "window_start": round(start, 3), "window_end": round(end, 3),
            "rpc": rpc, "provider": provider, "served_by": self.node, "routed_by": self.node,
            "calls": 0, **dict.fromkeys(OUTCOMES, 0),
            "latency_bounds_s": list(BOUNDS), "latency_buckets": [0] * (len(BOUNDS) + 1),
            "latency_sampled": 0, "latency_sum_s": 0.0, "latency_min_s": None,
            "latency_max_s": None, "peak_in_flight": 0, "provider_peak_in_flight": 0,
            "bytes_in": 0, "bytes_out": 0,
            "weight": 1.0 if weights is None else weights.of(rpc, provider),
            "policy": self.policy,
        }


def _per_provider(pending: dict[Row, int]) -> dict[tuple[str, str], int]:
    """The attempts pending per (rpc, provider), added over the routing nodes."""
    total: dict[tuple[str, str], int] = {}
    for row, n in pending.items():
        rpc, provider, _ = row.key
        key = (rpc, provider)
        total[key] = total.get(key, 0) + n
    return total


def _size(data: Any) -> int:
    """The msgpack size of a payload (what it took on the wire, less the frame around it)."""
    try:
        return len(packb(data))
    except (TypeError, ValueError, OverflowError):  # not msgpack (in-process tests only)
        return 0


class HistoryWriter:
    """A thread appending rows to the partitioned JSON-lines files; bounded queue."""

    def __init__(self, directory: str, node: str, max_queued: int = 1000) -> None:
        self.directory = directory
        self.node = node
        self.dropped = 0
        self.written = 0
        self.lag_s = 0.0                 # how long the last batch waited in the queue
        self._queue: queue.Queue[tuple[float, list[dict[str, Any]]] | None] = \
            queue.Queue(max_queued)
        self._file: Any = None
        self._path = ""
        self._good = 0                   # the file's size after its last whole write
        self._parts = 0                  # files this writer opened (each gets its own name)
        self._thread = threading.Thread(target=self._run, name="rpcbus-history", daemon=True)
        self._thread.start()

    def put(self, rows: list[dict[str, Any]]) -> None:
        try:
            self._queue.put_nowait((time.monotonic(), rows))
        except queue.Full:
            self.dropped += len(rows)
            log.warning("history_rows_dropped", rows=len(rows), total=self.dropped)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, close the file, stop the thread (waits up to ``timeout``)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            queued_at, rows = item
            try:
                self._write(rows)
            except OSError as exc:
                self.dropped += len(rows)
                log.error("history_write_failed", error=str(exc), rows=len(rows),
                          total_dropped=self.dropped)
            self.lag_s = time.monotonic() - queued_at
        if self._file is not None:
            self._file.close()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` whole, or none of them: a write that fails part-way (the disk
        full) is cut back to the file's last whole line, or, if even that fails, the file
        is left and the next rows start a new one; either way no row is ever torn."""
        start = rows[0]["window_start"]
        t = time.gmtime(start)
        folder = os.path.join(self.directory, time.strftime("date=%Y-%m-%d", t),
                              time.strftime("hour=%H", t), f"node={self.node}")
        if self._file is None or not self._path.startswith(folder + os.sep):
            if self._file is not None:
                self._file.close()  # a new hour: rotate
                self._file = None
            os.makedirs(folder, exist_ok=True)
            self._parts += 1
            suffix = f"-{self._parts}" if self._parts > 1 else ""
            self._path = os.path.join(folder, f"part-{int(start)}-{os.getpid()}{suffix}.jsonl")
            self._file = open(self._path, "ab", buffering=0)
            self._good = self._file.seek(0, os.SEEK_END)
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError:
            try:
                os.ftruncate(self._file.fileno(), self._good)
            except OSError:  # cannot even cut it back: leave that file, start another
                self._file.close()
                self._file = None
            raise
        self._good += len(data)
        self.written += len(rows)
