"""The load benchmark still runs end to end (a tiny run; real runs are manual)."""

import json
import os
import re
import subprocess
import sys

import pytest


def test_load_benchmark_smoke(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.benchmarks.load", "--duration", "0.5", "--warmup", "0.2",
         "--callers", "1", "--inflight", "20", "--max-calls", "500000", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    for side in ("baseline", "rpcbus"):
        r = result[side]
        assert r["calls_measured"] > 0 and r["errors"] == {} and r["unanswered"] == 0, r
    assert result["rpcbus"]["node_cpu_us_per_call"] > 0
    assert result["rpcbus"]["msgs_per_frame_in"] >= 1
    assert "rpcbus ÷ direct" in run.stdout


def test_soak_smoke(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.benchmarks.soak", "--duration", "3", "--rate", "300",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "soak.json").read_text())
    assert len(result["samples"]) >= 2
    assert all(s["calls"] > 0 and not s["errors"] for s in result["samples"])
    assert (tmp_path / "soak.png").stat().st_size > 1000


def test_rpcbus_bench_writes_its_report_and_compares_with_redis_and_nats(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.broker", "bench", "cross", "--smoke", "--compare",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    r = result["rpcbus"]
    assert result["scenario"] == "cross" and r["calls_measured"] > 0 and r["errors"] == {}
    assert r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"]
    assert len(r["cpu_us_per_call_by_node"]) == 2 and r["redis_cpu_us_per_call"] > 0
    assert r["throughput_series"] and r["msgs_per_publish"] >= 1
    # the nodes count each call once (on its caller's node), though every call crossed two
    assert r["calls_total"] <= r["calls_counted_by_nodes"] <= r["calls_total"] + r["unanswered"]
    # each node's batching, printed and in the report: n2 publishes every INVOKE, n1 every
    # answer, so each publishes a part of a PUBLISH per call
    n1, n2 = r["by_node"]
    assert all(0 < n["publishes_per_call"] <= 1 and n["msgs_per_publish"] >= 1
               for n in (n1, n2))
    assert re.search(r"^\s+n1\s+[\d.]+\s+[\d.]+/[\d.]+\s+[\d.]+\s+[\d.]+$", run.stdout, re.M)
    summary = (tmp_path / "summary.md").read_text()
    assert "| rpcbus |" in summary and "| n2 |" in summary
    for png in ("latency.png", "throughput.png"):
        assert (tmp_path / png).stat().st_size > 1000
    redis, nats = result["redis"], result["nats"]
    assert redis["calls_measured"] > 0 and redis["errors"] == {} and redis["unanswered"] == 0
    assert redis["rpcbus_ratio_calls_per_s"] > 0 and "rpcbus ÷ raw Redis" in run.stdout
    if "skipped" in nats:                     # ./dev test installs nats-server; CI must have it
        assert not os.environ.get("CI"), nats
    else:
        assert nats["calls_measured"] > 0 and nats["errors"] == {}
    assert redis["throughput_series"]         # the peers' too (their callers count them)


def test_a_run_on_a_busy_machine_says_so(tmp_path):
    """Two processes spinning beside the run (on this 2-core kind: the whole machine): the
    report says the run looks disturbed, and why."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        run = subprocess.run(
            [sys.executable, "-m", "rpcbus.broker", "bench", "local", "--smoke",
             "--no-baseline", "--out", str(tmp_path)], capture_output=True, text=True,
            timeout=180)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert run.returncode == 0, run.stderr
    r = json.loads((tmp_path / "result.json").read_text())["rpcbus"]
    assert r["disturbance"]["other_cores"] > 0.5, r["disturbance"]
    assert "WARNING (rpcbus): this run looks disturbed: other processes used" in run.stdout
    assert "**Warning (rpcbus)**" in (tmp_path / "summary.md").read_text()


@pytest.mark.timeout(300)
def test_a_soak_with_a_node_restarted_in_turn_fails_no_call(tmp_path):
    """The soak's restarts (a deploy's SIGTERM and start, one node every few seconds)
    under a steady rate of cross-node calls: no call fails (before: 24 of 171,390 and
    369 of 65,836 calls failed in 10-minute soaks, NO_PROVIDER on a live name)."""
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.benchmarks.soak", "--duration", "40", "--rate", "300",
         "--restart-every", "8", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    assert len(result["restarted"]) >= 3, result["restarted"]
    failed = [(s["t"], s["errors"]) for s in result["samples"] if s["errors"]]
    assert not failed, failed
    assert sum(s["calls"] for s in result["samples"]) > 300 * 30


@pytest.mark.timeout(300)
def test_rpcbus_bench_overload_sheds_what_it_cannot_serve_and_runs_nothing_late(tmp_path):
    """`rpcbus bench overload`, short, on 2 nodes: at 0.8 and 3 times the capacity it
    measures, calls are answered; what the providers cannot serve at 3x ends
    OVERLOADED (not run), never NO_PROVIDER, and no handler starts after its caller's
    deadline. Its speed figures are the bench's to print (docs/performance.md)."""
    out = tmp_path / "overload.json"
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.benchmarks.overload", "--nodes", "2", "--steps",
         "0.8,3", "--step-seconds", "1.5", "--no-nats", "--out", str(out)],
        capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    [result] = json.loads(out.read_text())
    steps = {s["factor"]: s for s in result["steps"]}
    assert set(steps) == {0.8, 3.0}
    for step in steps.values():
        assert step["outcomes"].get("OK", 0) > 0, step
        assert step["outcomes"].get("NO_PROVIDER", 0) == 0, step
        assert step["started_late"] == 0, step
    assert steps[3.0]["outcomes"].get("OVERLOADED", 0) > 0, steps[3.0]
    assert "p99 at 3x minus p99 at 0.8x" in run.stdout


def test_rpcbus_bench_events_accounts_for_every_event_beside_nats(tmp_path):
    """``rpcbus bench events``, tiny: every event an rpcbus subscriber did not get was
    told to it (GAP counts), on 1 node and across 2; NATS beside."""
    run = subprocess.run(
        [sys.executable, "-m", "rpcbus.broker", "bench", "events", "--fanout", "3",
         "--nodes", "1,2", "--duration", "0.5", "--compare", "nats", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "result.json").read_text())
    assert [(r["system"], r["nodes"]) for r in rows] == [("rpcbus", 1), ("rpcbus", 2),
                                                          ("nats", 1)]
    for r in rows:
        assert r["emitted"] > 0 and r["delivered"] > 0 and r["p99_ms"] is not None, r
    for r in rows[:2]:
        assert r["delivered"] + r["lost_told"] == r["expected"], r
    assert "| rpcbus | 2 | 3 |" in (tmp_path / "summary.md").read_text()


def test_the_micro_benchmark_drives_the_router_with_its_own_peers():
    """benchmarks/micro.py keeps its own minimal peer: the router's calls on it (every
    attribute a call reads of a peer, load history on) still run."""
    from rpcbus.benchmarks import micro

    micro.bench_router(1_000, history=True)
    micro.bench_codec(600)
