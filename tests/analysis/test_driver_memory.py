"""The rollup reaches the driver one part at a time (analytics/series.py ``stream``): a
rollup bigger than ``spark.driver.maxResultSize`` is analysed (one collect of it aborted
the job), and a job Spark aborts ends ``rpcbus analyze`` with one line, never a Python
traceback; a history with nothing to analyse says so in one line and leaves nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpcbus.analytics import analysis, series
from rpcbus.analytics.historygen import generate

from .conftest import PYSPARK_WARNINGS, history_rows

pytestmark = PYSPARK_WARNINGS
LIMIT = 256 << 10


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "history"
    generate(str(path), nodes=3, providers=12, rpcs=12, hours=1.25, window=10, seed=3)
    return path


@pytest.fixture(scope="module")
def limited():
    s = analysis.session("local[2]", {"spark.driver.maxResultSize": str(LIMIT)})
    s.sparkContext.setLogLevel("ERROR")
    yield s
    analysis.stop(s)


def test_a_rollup_bigger_than_the_drivers_result_limit_is_analysed(limited, history, tmp_path):
    written = analysis.analyze(limited, str(history), str(tmp_path / "out"))
    rows = history_rows(history)
    minutes = {(r["provider"], r["rpc"], r["served_by"], r["window_start"] // 60)
               for r in rows}
    assert written["per_minute"] == len(minutes)
    assert len(minutes) * series.ROW_BYTES > 4 * LIMIT         # far more than one result
    assert written["per_provider"] == len({(r["rpc"], r["provider"]) for r in rows})
    weights = {(r["rpc"], r["provider"])
               for r in limited.read.parquet(str(tmp_path / "out" / "weights")).collect()}
    assert len(weights) == written["per_provider"]             # every rpc once, whole


def test_a_job_spark_aborts_is_one_line_and_exit_1(history, tmp_path):
    """A result limit below what Spark's own tasks return: Spark aborts a job (Spark logs
    its reasons; rpcbus says one line, last)."""
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS":
           "--conf spark.driver.maxResultSize=8k pyspark-shell"}
    proc = subprocess.run(
        [sys.executable, "-m", "rpcbus.broker", "analyze", "--history", str(history),
         "--out", str(tmp_path / "out"), "--master", "local[2]", "--no-report"],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(said) == 1 and said[0] == proc.stderr.strip().splitlines()[-1]
    assert said[0].startswith("Error: Spark failed: Job aborted"), said
    # no trace on the terminal, Python's or the JVM's: Spark's log is in the file named
    assert "Traceback" not in proc.stderr and "\tat org.apache" not in proc.stderr
    assert "Exception" not in proc.stderr.replace(said[0], "")
    log = said[0].rsplit("(Spark's log: ", 1)[1].rstrip(")")
    assert "\tat org.apache.spark" in Path(log).read_text()


def test_nothing_to_analyse_is_one_line_and_leaves_nothing_behind(tmp_path):
    """A history with no usable row: exit 3, one line on the terminal (nothing of the
    JVM's), and no folder left under --out."""
    history = tmp_path / "history"
    history.mkdir()
    (history / "part.jsonl").write_text('{"schema_version": 99, "rpc": "x"}\n')
    out = tmp_path / "results" / "today"
    proc = subprocess.run(
        [sys.executable, "-m", "rpcbus.broker", "analyze", "--history", str(history),
         "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    said = proc.stderr.splitlines()
    assert len(said) == 1 and said[0].startswith("rpcbus analyze: no usable history rows "), \
        proc.stderr
    assert said[0].endswith(": nothing written")
    assert not (tmp_path / "results").exists()
