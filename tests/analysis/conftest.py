"""One Spark session (local[2]) for the modules here that use it (a JVM start each
would cost seconds; tests/conftest.py leaves its processes out of the per-module leak
check, and they end with it), and history rows to build histories from."""

import glob
import json
from pathlib import Path

import pytest

from rpcbus.analytics import analysis
from rpcbus.broker.rpcstats import BOUNDS
from tests.conftest import SHARED_PIDS

# PySpark starts its JVM with a stdin pipe it never closes (the JVM watches it to exit with
# the driver): that pipe's ResourceWarning is PySpark's, at garbage collection.
PYSPARK_WARNINGS = [
    pytest.mark.filterwarnings("ignore:unclosed file <_io.BufferedWriter:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(scope="package")
def spark():
    s = analysis.session("local[2]")
    s.sparkContext.setLogLevel("ERROR")
    jvm = s.sparkContext._gateway.proc.pid  # its workers descend from it
    SHARED_PIDS.add(jvm)
    yield s
    analysis.stop(s)
    SHARED_PIDS.discard(jvm)


def history_row(window, rpc, provider, calls, node="n1"):
    """A history row of 10 s window number ``window`` (from a fixed instant): ``calls``
    answered, one in 16 sampled at 1-2.5 ms."""
    buckets = [0] * (len(BOUNDS) + 1)
    buckets[4] = (calls + 15) // 16
    return {"schema_version": 1, "window_start": 1_795_000_000.0 + window * 10,
            "window_end": 1_795_000_010.0 + window * 10, "rpc": rpc, "provider": provider,
            "served_by": node, "routed_by": node, "calls": calls, "ok": calls, "rejected": 0,
            "errors": 0, "ack_timeouts": 0, "response_timeouts": 0, "latency_buckets": buckets,
            "latency_sampled": sum(buckets), "latency_sum_s": 0.002 * sum(buckets),
            "latency_min_s": None, "latency_max_s": None, "peak_in_flight": 1 if calls else 0,
            "provider_peak_in_flight": 1 if calls else 0, "bytes_in": 0, "bytes_out": 0,
            "weight": 1.0}


def write_rows(path, rows):
    """Rows as the JSON lines a node writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def history_rows(history):
    """Every row of the JSON lines under ``history`` that parses."""
    rows = []
    for path in glob.glob(f"{history}/**/*.jsonl", recursive=True):
        for line in Path(path).read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows
