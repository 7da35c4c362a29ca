"""The cost budget: every process on a call's path (nodes, the provider's SDK, the
caller's SDK) costs no more instructions per unit of work than its committed baseline
allows (benchmarks/cost.py, benchmarks/cost_baseline.json)."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(900)
def test_no_process_on_a_calls_path_costs_more_than_its_baseline():
    run = subprocess.run([sys.executable, "-m", "rpcbus.benchmarks.cost", "--check"],
                         capture_output=True, text=True, timeout=880)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "every figure within 5%" in run.stdout
