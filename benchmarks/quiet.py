"""Was the machine quiet while a benchmark measured? (``rpcbus bench`` says so when not.)

A busy machine makes a run read low (a rerun of one shape read 6,070 calls/s beside a
compile, 43,720 without). ``Watch`` takes the CPU time of the whole machine and of this
process's descendants (the nodes, redis-server, providers and callers a run starts) at
the start and the end of the measured window: what the rest of the machine used meanwhile,
in cores, is ``other_cores``. Beside it, ``dips`` finds the half-seconds of the window's
throughput series under a quarter of its median. ``verdict`` puts both in one sentence,
empty when the run looks clean (benchmarks/load.py adds them to a run's figures as
``disturbance`` and ``disturbed``). The thresholds only word the warning.
"""

from __future__ import annotations

import os
import statistics
import time

OTHER_CORES = 0.25   # the rest of the machine using more than this many cores: disturbed
DIP = 0.25           # a throughput sample under this share of the median: a dip


class Watch:
    """CPU seconds of the machine and of this process tree, from ``start`` to ``stop``."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._t0 = time.monotonic()
        self._machine0 = self._machine_busy()
        self._ours0 = self._ours()

    def _machine_busy(self) -> float:
        t = self._psutil.cpu_times()
        return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))

    def _ours(self) -> dict[int, float]:
        me = self._psutil.Process(os.getpid())
        out = {}
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except self._psutil.Error:  # gone meanwhile
                continue
        return out

    def stop(self) -> dict[str, float]:
        """The rest of the machine's CPU use over the window, in cores (``other_cores``),
        and this tree's (``our_cores``). A process of ours that started or ended inside
        the window counts its time from its start or up to its last reading."""
        seconds = max(1e-6, time.monotonic() - self._t0)
        busy = self._machine_busy() - self._machine0
        now = self._ours()
        ours = sum(t - self._ours0.get(pid, 0.0) for pid, t in now.items())
        return {"other_cores": round(max(0.0, busy - ours) / seconds, 3),
                "our_cores": round(ours / seconds, 3), "cores": self._psutil.cpu_count()}


def dips(series: list[list[float]]) -> list[list[float]]:
    """The samples (seconds into the window, calls/s) under ``DIP`` of the median."""
    rates = [r for _, r in series]
    if len(rates) < 3:
        return []
    median = statistics.median(rates)
    return [[t, r] for t, r in series if r < DIP * median]


def verdict(cpu: dict[str, float] | None, low: list[list[float]]) -> str:
    """One sentence on what disturbed the run ('' when nothing did)."""
    said = []
    if cpu is not None and cpu["other_cores"] > OTHER_CORES:
        said.append(f"other processes used {cpu['other_cores']:.2f} of the machine's "
                    f"{cpu['cores']} cores while it measured")
    if low:
        said.append(f"calls/s fell under a quarter of its median in {len(low)} half-second"
                    f"{'s' if len(low) > 1 else ''} (lowest {min(r for _, r in low):,.0f})")
    if not said:
        return ""
    return ("this run looks disturbed: " + "; ".join(said)
            + ". Its figures read low: rerun it on a quiet machine.")

