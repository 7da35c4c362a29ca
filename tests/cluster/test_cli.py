"""rpcbus cluster up and rpcbus status, as a user runs them."""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

import rpcbus

from ..timing import wait


@pytest.mark.parametrize("redis", [[], ["--redis-shards", "3", "--redis-replicas", "1"]],
                         ids=["redis-server", "redis-cluster"])
async def test_cluster_up_status_and_a_clean_stop(redis):
    up = subprocess.Popen([sys.executable, "-m", "rpcbus.broker", "cluster", "up", "--nodes", "2",
                           "--base-port", "0", *redis], stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        async with asyncio.timeout(wait(30)):
            while not lines or "stop: Ctrl-C" not in lines[-1]:
                lines.append(await asyncio.to_thread(up.stdout.readline))
                assert lines[-1], "cluster up exited early: " + "".join(lines)
        text = "".join(lines)
        urls = re.findall(r"ws://127\.0\.0\.1:\d+", text)
        pids = [int(p) for p in re.findall(r"pid (\d+)", text)]
        redis_url = re.search(r"redis(\+cluster)?://\S+", text).group(0)
        redis_ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", redis_url)]
        keys_file = re.search(r"status --config (\S+)", text).group(1)   # the bus is sealed
        assert os.stat(keys_file).st_mode & 0o777 == 0o600
        assert len(urls) == 2 and len(pids) == 2
        assert len(redis_ports) == (6 if redis else 1), redis_url   # 3 masters + 3 replicas
        async with rpcbus.connect(urls[0]) as prov:
            await prov.provide("billing.charge", lambda d: d)
            status = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "rpcbus.broker", "status", "--config",
                                 keys_file,
                                 "--listen", "2.5"], capture_output=True, text=True, timeout=30)
            assert status.returncode == 0, status.stderr
            assert re.search(r"^n1\s+ready\s+ws://", status.stdout, re.M), status.stdout
            assert re.search(r"^n2\s+ready\s+ws://", status.stdout, re.M), status.stdout
            assert re.search(r"^billing\.charge\s+n1: 1$", status.stdout, re.M), status.stdout
            keyless = await asyncio.to_thread(   # the bus is sealed: one line says so
                subprocess.run, [sys.executable, "-m", "rpcbus.broker", "status", "--redis",
                                 redis_url, "--listen", "1.5"], capture_output=True,
                text=True, timeout=30)
            assert keyless.returncode == 1 and "--config" in keyless.stderr, keyless.stderr
            assert "Traceback" not in keyless.stderr
            as_json = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "rpcbus.broker", "status", "--config",
                                 keys_file,
                                 "--listen", "1.5", "--json"], capture_output=True, text=True,
                timeout=30)
            nodes = json.loads(as_json.stdout)
            assert nodes["n1"]["providers"] == {"billing.charge": 1}
            assert nodes["n2"]["state"] == "ready" and nodes["n2"]["url"] == urls[1]
            watch = subprocess.Popen([sys.executable, "-m", "rpcbus.broker", "status", "--config",
                                      keys_file, "--listen", "1.2", "--watch", "--json"],
                                     stdout=subprocess.PIPE, text=True)
            try:
                for _ in range(2):                       # it refreshes until stopped
                    line = await asyncio.to_thread(watch.stdout.readline)
                    assert set(json.loads(line)) == {"n1", "n2"}
                watch.send_signal(signal.SIGINT)
                assert await asyncio.to_thread(watch.wait, 10) == 0
            finally:
                if watch.poll() is None:
                    watch.kill()
                    watch.wait()
                watch.stdout.close()
        up.send_signal(signal.SIGINT)
        rest = await asyncio.to_thread(up.communicate, timeout=30)
        assert up.returncode == 0 and "n1 exit 0, n2 exit 0" in rest[0]
        assert not os.path.exists(keys_file)
        for pid in pids:  # no orphan node processes
            try:
                os.kill(pid, 0)
                raise AssertionError(f"node pid {pid} still runs")
            except ProcessLookupError:
                pass
        for port in redis_ports:  # nor redis-servers
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        up.stdout.close()


def test_cluster_up_says_at_once_why_a_node_did_not_start():
    """A node that dies on start (its port taken) is reported in one line, in its own
    words, when it dies (not after the 30 s ready timeout, not as a traceback)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = subprocess.run([sys.executable, "-m", "rpcbus.broker", "cluster", "up",
                             "--nodes", "1", "--base-port", str(port)],
                            capture_output=True, text=True, timeout=20)
    assert up.returncode == 1 and "Traceback" not in up.stderr, up.stderr
    assert up.stderr.startswith("Error: the node exited with code 1 before it was ready: "
                                f"cannot listen on 127.0.0.1:{port}"), up.stderr
