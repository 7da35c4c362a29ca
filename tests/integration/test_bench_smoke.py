"""The load benchmark still runs end to end (a tiny run; real runs are manual)."""

import json
import subprocess
import sys


def test_load_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--duration", "0.5", "--warmup", "0.2",
         "--callers", "1", "--inflight", "20", "--max-calls", "500000", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    for side in ("baseline", "rpcbus"):
        r = result[side]
        assert r["calls_measured"] > 0 and r["errors"] == {} and r["unanswered"] == 0, r
    assert result["rpcbus"]["node_cpu_us_per_call"] > 0
    assert result["rpcbus"]["msgs_per_frame_in"] >= 1
    assert "rpcbus ÷ direct" in run.stdout


def test_soak_smoke(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--duration", "3", "--rate", "300",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "soak.json").read_text())
    assert len(result["samples"]) >= 2
    assert all(s["calls"] > 0 and not s["errors"] for s in result["samples"])
    assert (tmp_path / "soak.png").stat().st_size > 1000
