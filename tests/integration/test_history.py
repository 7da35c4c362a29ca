"""Provider load history written by a real node: what the files say equals what was done."""

import asyncio
import glob
import json
import os
from pathlib import Path

import rpcbus
from rpcbus.broker.history import SCHEMA_VERSION
from rpcbus.broker.process import NodeProcess

from .conftest import FAST


async def test_history_counts_every_attempt_per_provider_and_window(tmp_path):
    node = NodeProcess(env={**FAST, "RPCBUS_HISTORY_DIR": str(tmp_path),
                            "RPCBUS_HISTORY_WINDOW": "0.25"}).start()
    try:
        async with rpcbus.connect(node.url, name="billing-worker-3") as good, \
                rpcbus.connect(node.url) as bad, rpcbus.connect(node.url) as caller:
            async def echo(d):  # slow enough that the in-flight samples (0.1 s) see a burst
                await asyncio.sleep(0.15)
                return d

            await good.provide("h.echo", echo)
            await bad.provide("h.fail", lambda d: 1 / 0)
            for _ in range(4):                              # spread over several windows
                sent = [{"i": i, "pad": "x" * 200} for i in range(100)]  # 210 bytes each
                assert await asyncio.gather(*(caller.call("h.echo", d, timeout=5)
                                              for d in sent)) == sent
                await asyncio.sleep(0.3)
            for _ in range(5):
                try:
                    await caller.call("h.fail", timeout=5)
                except rpcbus.ProviderError:
                    pass
            bad_name = bad.session["session"]
    finally:
        assert node.stop() == 0
    rows = [json.loads(line) for path in glob.glob(f"{tmp_path}/date=*/hour=*/node=*/*.jsonl")
            for line in Path(path).read_text().splitlines()]
    assert rows and all(r["schema_version"] == SCHEMA_VERSION for r in rows)
    assert {os.path.basename(os.path.dirname(p)) for p in
            glob.glob(f"{tmp_path}/date=*/hour=*/node=*/*.jsonl")} == {f"node={node.name}"}
    echo = [r for r in rows if r["rpc"] == "h.echo"]
    assert sum(r["calls"] for r in echo) == sum(r["ok"] for r in echo) == 400
    assert {r["provider"] for r in echo} == {"billing-worker-3"}
    assert len({r["window_start"] for r in echo}) >= 3              # several windows
    assert all(r["served_by"] == r["routed_by"] == node.name for r in rows)
    fail = [r for r in rows if r["rpc"] == "h.fail"]
    assert sum(r["errors"] for r in fail) == 5 and {r["provider"] for r in fail} == {bad_name}
    sampled = sum(r["latency_sampled"] for r in echo)
    assert sampled == sum(sum(r["latency_buckets"]) for r in echo) and 400 // 16 - 1 <= sampled
    # payloads of one size: the estimate from the measured ones is exact
    assert sum(r["bytes_in"] for r in echo) == sum(r["bytes_out"] for r in echo) == 400 * 210
    assert all(r["weight"] == 1.0 for r in rows)                      # no weights file
    # a window with work saw at least one attempt in flight; one without (the pauses
    # between bursts, if a window fits in one) has a presence row: no calls, nothing in flight
    assert all(r["peak_in_flight"] >= 1 for r in echo if r["calls"])
    assert all(r["calls"] == r["latency_sampled"] == 0 for r in echo if not r["peak_in_flight"])
    assert max(r["peak_in_flight"] for r in echo) >= 50               # 100 at once
    # one routing node here: the provider's peak over routing nodes is its row's
    assert all(r["provider_peak_in_flight"] == r["peak_in_flight"] for r in echo)


_FULL_DISK = r'''
import json, resource, signal, sys, time
from rpcbus.broker.history import HistoryWriter

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, as a full disk's ENOSPC
writer = HistoryWriter(sys.argv[1], "n1")
rows = [{"schema_version": 1, "window_start": 1.7e9, "i": i, "pad": "x" * 100}
        for i in range(30)]

def settle(n):
    deadline = time.monotonic() + 10
    while writer.written + writer.dropped < n and time.monotonic() < deadline:
        time.sleep(0.01)

resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))  # "full" at 1 kB
for i in range(20):
    writer.put(rows[i:i + 1])
settle(20)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
writer.put(rows[20:30])  # space again
writer.close()
print(json.dumps({"written": writer.written, "dropped": writer.dropped}))
'''


def test_a_full_disk_drops_whole_rows_and_never_tears_one(tmp_path):
    """Writes that fail part-way (the file may not grow: the disk is full) drop their
    rows whole, counted; the rows after the disk has room again are whole lines."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path)], check=True,
                         capture_output=True, text=True, timeout=60)
    counts = json.loads(out.stdout.splitlines()[-1])  # after the writer's log lines
    lines = [line for f in sorted(glob.glob(f"{tmp_path}/**/*.jsonl", recursive=True))
             for line in Path(f).read_text().splitlines()]
    kept = [json.loads(line)["i"] for line in lines]  # every line is one whole row
    assert counts["written"] == len(kept) and counts["dropped"] == 30 - len(kept)
    assert counts["dropped"] > 0 and kept[-10:] == list(range(20, 30))
    assert kept == sorted(set(kept))
