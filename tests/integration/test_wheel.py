"""The wheel, as a new user gets it: one import name, beside a project with folders named
like ours, running the README's SDK example against a node and a local cluster."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]
URL = re.compile(r"ws://127\.0\.0\.1:\d+")


def readme_quickstart() -> tuple[list[list[str]], str]:
    """The README's Quickstart: its shell commands (comments cut) and its program."""
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quickstart"):]
    shell = re.search(r"```sh\n(.*?)```", quick, re.S)
    program = re.search(r"```python\n(.*?)```", quick, re.S)
    assert shell and program and "rpcbus.connect" in program.group(1)
    commands = [shlex.split(line.split("  #")[0]) for line in shell.group(1).splitlines()]
    return commands, program.group(1)


def readme_own_node() -> list[list[str]]:
    """The README's "node of your own" commands (comments cut)."""
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("A node of your own"):]
    shell = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert shell
    return [shlex.split(line.split("  #")[0]) for line in shell.group(1).splitlines()]


def as_here(argv: list[str], rpcbus_cmd: str, python: str, ports: dict[str, str]) -> list[str]:
    """A README command for this venv, its ws:// URLs moved to the ports used here."""
    exe = {".venv/bin/rpcbus": rpcbus_cmd, ".venv/bin/python": python}
    out = [exe.get(argv[0], argv[0])]
    for arg in argv[1:]:
        for readme_url, url in ports.items():
            arg = arg.replace(readme_url, url)
        out.append(arg)
    return out


def tracked_copy(dest: Path, under: str = ".") -> Path:
    """A copy of the files git knows under ``under`` (a build in place would write into
    the tree, and would take what git ignores)."""
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                              under], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest / under


def build_wheel(tmp: Path) -> Path:
    """Built from a copy of the files git knows."""
    src = tracked_copy(tmp / "src")
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


def ready_url(node: subprocess.Popen[str]) -> str:
    """The URL a node started with JSON logs on stderr gives in its node_ready line."""
    for line in node.stderr:
        event = json.loads(line)
        if event.get("event") == "node_ready":
            return event["url"]
    raise AssertionError("the node exited before it was ready")


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

    commands, program = readme_quickstart()
    assert [c[:3] for c in commands] == [[".venv/bin/rpcbus", "cluster", "up"],
                                         [".venv/bin/python", "adder.py"],
                                         [".venv/bin/rpcbus", "call", "math.add"]]

    def quickstart(ports: dict[str, str]) -> None:
        """Steps 2 and 3 of the Quickstart: the program provides and calls once, then
        serves; `rpcbus call` through another node gets its answer; Ctrl-C ends it."""
        source = program
        for readme_url, url in ports.items():
            source = source.replace(readme_url, url)
        (project / "adder.py").write_text(source)
        adder = subprocess.Popen(as_here(commands[1], rpcbus_cmd, python, ports), cwd=project,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert adder.stdout.readline() == "3\n"
            called = subprocess.run(as_here(commands[2], rpcbus_cmd, python, ports),
                                    cwd=project, capture_output=True, text=True, timeout=60)
            assert (called.returncode, called.stdout) == (0, "3\n"), called.stderr
            adder.send_signal(signal.SIGINT)
            rest, errors = adder.communicate(timeout=30)
            # the SDK prints nothing of its own, on stdout or stderr
            assert (adder.returncode, rest, errors) == (0, "", "")
        finally:
            if adder.poll() is None:
                adder.kill()
                adder.communicate()

    version = subprocess.run([rpcbus_cmd, "--version"], cwd=project, capture_output=True,
                             text=True, check=True).stdout
    where = subprocess.run([python, "-c", "import rpcbus; print(rpcbus.__file__)"],
                           cwd=project, capture_output=True, text=True, check=True).stdout
    assert version.startswith("rpcbus ") and str(venv) in where   # the wheel's, not ours
    defaults = subprocess.run([rpcbus_cmd, "config", "--defaults"], cwd=project,
                              capture_output=True, text=True, check=True).stdout
    assert defaults == (ROOT / "conf" / "rpcbus.toml").read_text()

    # an application under mypy --strict learns of a misspelt option before it runs
    (project / "app.py").write_text(
        "import rpcbus\n\n\n"
        "async def main() -> None:\n"
        "    async with rpcbus.connect('ws://127.0.0.1:1', name='w', reconnect=False) as c:\n"
        "        await c.call('f', None)\n"
        "    await rpcbus.connect('ws://127.0.0.1:1', nmae='typo')\n\n\n"
        "def blocking() -> None:\n"
        "    rpcbus.connect_sync('ws://127.0.0.1:1', open_timeout='soon')\n\n\n"
        "async def found(c: rpcbus.Client) -> str:\n"
        "    names = [r['rpc'] for r in await c.rpcs()]\n"
        "    ok = [r.value for r in await c.call_all('f') if r.ok]\n"
        "    return str((names, ok, (await c.rpcs())[0]['name']))\n")
    typed = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                            "--python-executable", python, "app.py"], cwd=project,
                           capture_output=True, text=True)
    errors = [line for line in typed.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 3, typed.stdout
    assert 'app.py:7: error: Unexpected keyword argument "nmae"' in errors[0]
    assert 'app.py:11: error: Argument "open_timeout"' in errors[1]
    assert 'app.py:17: error: TypedDict "RpcInfo" has no key "name"' in errors[2]

    # the systemd unit as docs/operations.md installs it, for this venv
    unit = subprocess.run([rpcbus_cmd, "config", "--systemd-unit"], cwd=project,
                          capture_output=True, text=True, check=True).stdout
    assert f"ExecStart={rpcbus_cmd} node --config /etc/rpcbus/node.toml\n" in unit
    analyze = shutil.which("systemd-analyze")
    if analyze is not None or os.environ.get("CI"):
        (project / "rpcbus.service").write_text(unit)
        verified = subprocess.run([analyze or "systemd-analyze", "verify", "rpcbus.service"],
                                  cwd=project, capture_output=True, text=True)
        assert (verified.returncode, verified.stderr) == (0, ""), verified.stderr

    # rpcbus bench, a user feature, from the wheel (its workers start as python -m)
    bench = subprocess.run([rpcbus_cmd, "bench", "local", "--smoke", "--out",
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
        url = ready_url(node)
        quickstart({"ws://127.0.0.1:6021": url, "ws://127.0.0.1:6023": url})
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
        node.stderr.close()

    # a node of one's own, as the README writes it: its config with a user, on a Redis
    from rpcbus.broker.local import RedisServer

    made, joined = readme_own_node()
    assert made[:3] == [".venv/bin/rpcbus", "config", "--defaults"] and made[-1] == "node.toml"
    config = subprocess.run(as_here(made[:-2], rpcbus_cmd, python, {}), cwd=project,
                            capture_output=True, text=True, check=True)
    (project / "node.toml").write_text(config.stdout)
    token = config.stderr.strip().rsplit(": ", 1)[1]
    redis = RedisServer().start()
    argv = as_here(joined, rpcbus_cmd, python, {"redis://127.0.0.1:6379/0": redis.url})
    argv[argv.index("--port") + 1] = "0"
    node = subprocess.Popen(argv, cwd=project, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RPCBUS_LOG_FORMAT": "json"})
    try:
        served = subprocess.run([rpcbus_cmd, "call", "nobody.here", "{}", "--url", ready_url(node),
                                 "--token", token, "--timeout", "2"],
                                cwd=project, capture_output=True, text=True, timeout=60)
        assert "NO_PROVIDER" in served.stderr, served.stderr     # signed in, then refused
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
        node.stderr.close()
        redis.stop()

    # the Quickstart's cluster (free ports for 6021..6023): an embedded redis-server and
    # nodes started as python -m, from a directory whose broker/ would shadow a package
    up = subprocess.Popen(as_here(commands[0], rpcbus_cmd, python, {}) + ["--base-port", "0"],
                          cwd=project, stdout=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "stop: Ctrl-C" not in seen:
            line = up.stdout.readline()
            assert line, "cluster up exited early: " + seen
            seen += line
        urls = URL.findall(seen)
        assert len(urls) == 3
        quickstart({"ws://127.0.0.1:6021": urls[0], "ws://127.0.0.1:6023": urls[2]})
        up.send_signal(signal.SIGINT)
        rest = up.communicate(timeout=30)[0]
        assert up.returncode == 0 and "n1 exit 0, n2 exit 0, n3 exit 0" in rest, rest
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        up.stdout.close()
