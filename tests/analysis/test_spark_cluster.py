"""The analysis on a Spark standalone cluster: a master and two workers started with
pyspark's own ``bin/spark-class`` on loopback, then ``rpcbus analyze --master spark://...``
and the documented ``spark-submit --master spark://...`` recipe (docs/history.md, "On a
Spark cluster") against it, at once, one core each. The history and the output are on
this machine's disk, which every worker shares here; on several machines they would be
on shared storage."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from contextlib import ExitStack
from pathlib import Path

import pytest

from rpcbus.analytics.historygen import generate
from rpcbus.broker.weights import load as load_weights

from .conftest import PYSPARK_WARNINGS

pytestmark = PYSPARK_WARNINGS

BIN = Path(sys.executable).parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class(*args, log):
    import pyspark

    exe = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    return subprocess.Popen([str(exe), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two workers (1 core, 1 GiB each); yields the master URL."""
    work = tmp_path_factory.mktemp("spark")
    port, ui = free_port(), free_port()
    with ExitStack() as stack:
        procs = []

        def stop():
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        stack.callback(stop)
        log = stack.enter_context(open(work / "cluster.log", "wb"))
        procs.append(spark_class("org.apache.spark.deploy.master.Master", "--host",
                                 "127.0.0.1", "--port", str(port), "--webui-port", str(ui),
                                 log=log))
        master = f"spark://127.0.0.1:{port}"
        for i in range(2):
            procs.append(spark_class(
                "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
                "--cores", "1", "--memory", "1g", "--webui-port", "0",
                "--work-dir", str(work / f"worker{i}"), log=log))
        deadline = time.monotonic() + 90
        while True:          # the master's JSON page lists the workers that registered
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    alive = [w for w in json.load(r)["workers"] if w["state"] == "ALIVE"]
                if len(alive) == 2:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                pytest.fail("the Spark cluster did not start: "
                            + (work / "cluster.log").read_text()[-3000:])
            time.sleep(0.5)
        yield master


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("history")
    generate(str(path), nodes=2, providers=3, rpcs=2, hours=0.25, seed=3)
    return path


def start(args, cwd):
    """A Spark application of one core (the two below share the cluster's two, at once)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": "",   # loopback only
           "PYSPARK_SUBMIT_ARGS": "--conf spark.cores.max=1 pyspark-shell"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)


def finished(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "done in" in out


def written(out):
    assert load_weights(str(out / "weights.json")).rpcs               # a usable file
    for table in ("per_minute", "per_hour", "fairness", "weights"):
        assert any(p.suffix == ".parquet" for p in (out / table).iterdir())


# Its own waits bound it (the cluster's start 90 s, each application 300 s): on a slow
# machine it passed 120 s, the suite's bound for what waits on rpcbus alone
@pytest.mark.timeout(600)
def test_analyze_and_the_documented_spark_submit_run_on_a_standalone_cluster(
        cluster, history, tmp_path):
    bundle = tmp_path / "rpcbus.zip"
    made = subprocess.run([str(BIN / "rpcbus"), "analyze-bundle", str(bundle)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    app = made.stdout.split()[3]                       # spark-submit --py-files ZIP APP ...
    names = zipfile.ZipFile(bundle).namelist()         # the SDK core and the analytics only
    assert "rpcbus/schema.py" in names and "rpcbus/analytics/analysis.py" in names
    assert not [n for n in names if n.startswith(("rpcbus/broker", "rpcbus/cluster"))]
    analyze = start([str(BIN / "rpcbus"), "analyze", "--history", str(history), "--out",
                     str(tmp_path / "analyze"), "--master", cluster, "--no-report"], tmp_path)
    submit = start([str(BIN / "spark-submit"), "--master", cluster, "--conf",
                    "spark.cores.max=1", "--py-files", str(bundle), app, "--history",
                    str(history), "--out", str(tmp_path / "submit"), "--report-dir",
                    str(tmp_path / "report")], tmp_path)
    finished(analyze)
    finished(submit)
    written(tmp_path / "analyze")
    written(tmp_path / "submit")
    assert (tmp_path / "report" / "report.html").is_file()
