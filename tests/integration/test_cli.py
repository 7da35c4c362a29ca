"""The rpcbus command: call, node start-up errors, graceful stop on SIGTERM."""

import asyncio
import json
import os
import signal
import subprocess
import sys

import rpcbus
from rpcbus import protocol as p

from .raw import RawPeer


def run_cli(*args, timeout=30, env=None):
    return subprocess.run([sys.executable, "-m", "rpcbus.broker", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


async def test_call_prints_the_answer_as_json_and_fails_with_the_code(node):
    async with rpcbus.connect(node.url) as prov:
        await prov.provide("math.add", lambda d: {"sum": d["a"] + d["b"]})
        ok = await asyncio.to_thread(run_cli, "call", "math.add", '{"a": 1, "b": 2}',
                                     "--url", node.url)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == '{"sum": 3}'
        missing = await asyncio.to_thread(run_cli, "call", "no.such.rpc", "--url", node.url)
        assert missing.returncode == 1 and missing.stderr.startswith("NO_PROVIDER")
        bad = await asyncio.to_thread(run_cli, "call", "math.add", "{nope", "--url", node.url)
        assert bad.returncode == 2 and "not JSON" in bad.stderr
        # the node from RPCBUS_URL, as the nats CLI reads NATS_URL; mistakes in one line
        via_env = await asyncio.to_thread(run_cli, "call", "math.add", '{"a": 2, "b": 2}',
                                          env={"RPCBUS_URL": node.url})
        assert via_env.returncode == 0 and via_env.stdout.strip() == '{"sum": 4}'
        for args in (("--timeout", "0"), ("--url", "127.0.0.1:6020")):
            wrong = await asyncio.to_thread(run_cli, "call", "math.add", "{}", *args)
            assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
        # what the node provides, and one name's providers with their last minute
        names = await asyncio.to_thread(run_cli, "rpcs", "--url", node.url)
        assert names.returncode == 0, names.stderr
        assert names.stdout.splitlines()[1].split()[:2] == ["math.add", "1"]
        who = await asyncio.to_thread(run_cli, "rpcs", "math.add", "--json", "--url", node.url)
        [row] = json.loads(who.stdout)
        assert row["provider"] and row["node"] and row["weight"] == 1.0
        assert row["calls"] == 2 and row["errors"] == 0


def test_variables_that_name_no_setting_do_not_stop_a_node(start_node):
    """RPCBUS_URL and RPCBUS_TOKEN are rpcbus call's; RPCBUS_PROJECT some tool's own."""
    node = start_node(RPCBUS_URL="ws://elsewhere:1", RPCBUS_TOKEN="t", RPCBUS_PROJECT="p")
    assert node.url
    typo = run_cli("node", "--port", "0", "--auth", "none",
                   env={"RPCBUS_RPC_ACK_TIMOUT": "1"})
    assert typo.returncode == 2 and "did you mean RPCBUS_RPC_ACK_TIMEOUT" in typo.stderr


def test_a_node_needs_users_or_auth_none_set_explicitly(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RPCBUS_")}
    result = subprocess.run([sys.executable, "-m", "rpcbus.broker", "node", "--port", "0"],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2 and 'auth.mode is "users"' in result.stderr
    assert "--auth none" in result.stderr


def test_node_refuses_an_unknown_config_key(tmp_path):
    conf = tmp_path / "bad.toml"
    conf.write_text("[rpc]\nack_timeout = 1.0\nretries = 3\n")
    result = run_cli("node", "--port", "0", "--config", str(conf))
    assert result.returncode == 2 and "unknown key rpc.retries" in result.stderr


async def test_sigterm_drains_calls_in_flight_refuses_new_ones_and_exits_0(start_node):
    node = start_node()
    started = asyncio.Event()
    release = asyncio.Event()
    running = 0

    async def slow(data):
        nonlocal running
        running += 1
        if running == 20:
            started.set()
        await release.wait()
        return data

    raw = await RawPeer.open(node.url)
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("slow", slow)
        calls = [asyncio.create_task(caller.call("slow", i, timeout=10)) for i in range(20)]
        await started.wait()
        node.signal(signal.SIGTERM)
        await asyncio.to_thread(node.wait_event, "node_draining")
        refused = await raw.expect(p.ERROR)               # the notice, then new calls refused
        assert refused[1] is None and refused[2] == "SHUTTING_DOWN"
        await raw.send([p.REQUEST, 7, "slow", 1, 5000])
        assert (await raw.expect(p.ERROR))[1:3] == [7, "SHUTTING_DOWN"]
        assert caller.state == "reconnecting"             # the SDK looks for another node
        release.set()
        assert await asyncio.gather(*calls) == list(range(20))
        code = await asyncio.to_thread(node.proc.wait, 20)
        assert code == 0


def _without(module, *args, env=None):
    """rpcbus ARGS in a process where ``module`` cannot be imported (as if not installed)."""
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv[0] = 'rpcbus'; "
            "from rpcbus.broker import run; run()")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **(env or {})})


def _one_line_error(result, code=1):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_a_missing_part_or_a_bad_value_is_one_line_saying_what_to_do(tmp_path):
    history = ("analyze", "--history", str(tmp_path), "--out", str(tmp_path / "out"))
    assert "pip install 'rpcbus[spark]'" in _one_line_error(_without("pyspark", *history))
    assert "needs pyarrow: pip install" in _one_line_error(_without("pyarrow", *history))
    assert "pip install 'rpcbus[bench]'" in _one_line_error(_without("psutil", "bench"))
    no_java = {"PATH": str(tmp_path), "JAVA_HOME": ""}          # no java anywhere
    assert "needs Java" in _one_line_error(run_cli(*history, env=no_java))
    assert not (tmp_path / "out").exists()
    nowhere = _one_line_error(run_cli("analyze", "--history", str(tmp_path / "nowhere"),
                                      "--out", str(tmp_path / "out")), code=2)
    assert nowhere.endswith("give the nodes' history directory (their history.dir)")
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "n1.jsonl").write_text("{}\n")
    (tmp_path / "h" / "n2.jsonl").symlink_to(tmp_path / "gone.jsonl")  # listed, unreadable
    unreadable = _one_line_error(run_cli("analyze", "--history", str(tmp_path / "h"),
                                         "--out", str(tmp_path / "out")), code=2)
    assert unreadable.startswith(f"Error: cannot read {tmp_path / 'h' / 'n2.jsonl'}: ")
    (tmp_path / "h" / "n2.jsonl").unlink()
    unwritable = _one_line_error(run_cli("analyze", "--history", str(tmp_path / "h"),
                                         "--out", str(tmp_path / "h" / "n1.jsonl" / "out")),
                                 code=2)
    assert unwritable.startswith(f"Error: cannot write to {tmp_path / 'h' / 'n1.jsonl'}")
    gen = ("history-gen", "--out", str(tmp_path / "g"), "--providers", "3", "--hours", "0.01")
    assert "p9: no such provider" in _one_line_error(run_cli(*gen, "--failing", "p9"), code=2)
    for args in (("bench", "--duration", "0"), ("bench", "nowhere"),
                 ("analyze", "--history", "h", "--out", "o", "--since", "yesterday")):
        wrong = run_cli(*args)
        assert wrong.returncode == 2 and "Error:" in wrong.stderr, wrong.stderr
        assert "Traceback" not in wrong.stderr
