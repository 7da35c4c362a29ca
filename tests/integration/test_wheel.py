"""The wheel, as a new user gets it: one import name, beside a project with folders named
like ours, running the README's SDK example against a node and a local cluster."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]
URL = re.compile(r"ws://127\.0\.0\.1:\d+")


def readme_example(url: str) -> str:
    """The README's SDK example (its first python block), aimed at ``url``."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block and "rpcbus.connect" in block.group(1)
    return block.group(1).replace("ws://127.0.0.1:6020", url)


def build_wheel(tmp: Path) -> Path:
    """Built from a copy of the files git knows (a build in place would write into the tree)."""
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], check=True,
                   capture_output=True)
    (wheel,) = (tmp / "dist").glob("rpcbus-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new venv with the wheel installed. Its dependencies are lent by this venv (a path
    line in a .pth, which processes none of this venv's .pth files, so not its editable
    rpcbus): the test makes no registry traffic and tests the wheel's own files."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True,
                          check=True).stdout.strip()
    Path(site, "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def user_project(tmp: Path) -> Path:
    """A project of the user's, with its own clients/, broker/ and cluster/ packages."""
    project = tmp / "project"
    for name in ("clients", "broker", "cluster"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(
            f"raise ImportError('the project\\'s own {name} package was imported')\n")
    return project


def test_the_wheel_is_rpcbus_alone_and_its_readme_runs_beside_same_named_folders(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"rpcbus", wheel.name.split("-py")[0]
                                                + ".dist-info"}
    for shipped in ("rpcbus/py.typed", "rpcbus/conf/rpcbus.toml", "rpcbus/broker/dashboard.html",
                    "rpcbus/analytics/analysis.py", "rpcbus/benchmarks/bench.py"):
        assert shipped in names, shipped
    assert any(n.endswith("LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    assert b"# Changelog" in metadata                    # the description carries it

    venv = fresh_venv(tmp_path, wheel)
    python, rpcbus_cmd = str(venv / "bin" / "python"), str(venv / "bin" / "rpcbus")
    project = user_project(tmp_path)

    def run_example(url):
        (project / "example.py").write_text(readme_example(url))
        done = subprocess.run([python, "example.py"], cwd=project, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert (done.stdout, done.stderr) == ("3\n", "")  # the SDK prints nothing of its own

    version = subprocess.run([rpcbus_cmd, "--version"], cwd=project, capture_output=True,
                             text=True, check=True).stdout
    where = subprocess.run([python, "-c", "import rpcbus; print(rpcbus.__file__)"],
                           cwd=project, capture_output=True, text=True, check=True).stdout
    assert version.startswith("rpcbus ") and str(venv) in where   # the wheel's, not ours
    defaults = subprocess.run([rpcbus_cmd, "config", "--defaults"], cwd=project,
                              capture_output=True, text=True, check=True).stdout
    assert defaults == (ROOT / "conf" / "rpcbus.toml").read_text()

    # rpcbus bench, a user feature, from the wheel (its workers start as python -m)
    bench = subprocess.run([rpcbus_cmd, "bench", "local", "--smoke", "--out-dir",
                            str(tmp_path / "bench")], cwd=project, capture_output=True,
                           text=True, timeout=180)
    assert bench.returncode == 0, bench.stderr[-2000:]
    result = json.loads((tmp_path / "bench" / "result.json").read_text())
    assert result["rpcbus"]["calls_measured"] > 0 and result["rpcbus"]["errors"] == {}

    # one node, authentication off
    node = subprocess.Popen([rpcbus_cmd, "node", "--auth", "none", "--port", "0"],
                            cwd=project, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RPCBUS_LOG_FORMAT": "json"})
    try:
        for line in node.stderr:
            event = json.loads(line)
            if event.get("event") == "node_ready":
                break
        else:
            raise AssertionError("the node exited before it was ready")
        run_example(event["url"])
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
        node.stderr.close()

    # a local cluster: an embedded redis-server and two nodes started as python -m, from a
    # directory whose own broker/ would shadow a package of that name
    up = subprocess.Popen([rpcbus_cmd, "cluster", "up", "--nodes", "2", "--base-port", "0"],
                          cwd=project, stdout=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "stop: Ctrl-C" not in seen:
            line = up.stdout.readline()
            assert line, "cluster up exited early: " + seen
            seen += line
        urls = URL.findall(seen)
        assert len(urls) == 2
        run_example(urls[1])
        up.send_signal(signal.SIGINT)
        rest = up.communicate(timeout=30)[0]
        assert up.returncode == 0 and "n1 exit 0, n2 exit 0" in rest, rest
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        up.stdout.close()
