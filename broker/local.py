"""A local cluster for development, demos and tests: an embedded redis-server and nodes.

``RedisServer`` runs ``redis-server`` on a free loopback port with nothing
kept on disk (tests kill, pause and restart it on the same port).
``LocalCluster`` adds N node processes (broker/process.py) and stops
everything — nodes first, with SIGTERM so they drain — on ``stop()``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Any

from rpcbus.broker.process import NodeProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisSentinel:
    """A ``redis-server --sentinel`` on a free loopback port watching one master."""

    def __init__(self, master_port: int, name: str = "rpcbus", directory: str = "/tmp") -> None:
        self.port = free_port()
        self.name = name
        self.config = os.path.join(directory, f"sentinel-{self.port}.conf")
        with open(self.config, "w") as f:  # sentinel rewrites its config file: its own copy
            f.write(f"port {self.port}\nbind 127.0.0.1\n"
                    f"sentinel monitor {name} 127.0.0.1 {master_port} 1\n"
                    f"sentinel down-after-milliseconds {name} 500\n"   # quick, for tests
                    f"sentinel failover-timeout {name} 2000\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> "RedisSentinel":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (./dev setup installs it)")
        self.proc = subprocess.Popen([exe, self.config, "--sentinel"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_server(self.proc, self.port, timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)


def wait_for_server(proc: subprocess.Popen[Any], port: int, timeout: float = 10.0,
                    say: bytes = b"PING\r\n", answers: tuple[bytes, ...] = (b"+", b"-"),
                    name: str = "redis-server") -> None:
    """Until the child ``proc`` answers on ``port``: sends ``say`` (if any) and waits for a
    reply starting with one of ``answers`` (Redis: PONG, or NOAUTH with ACL users)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # a child process: nothing to await but its port
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                if say:
                    s.sendall(say)
                if s.recv(16).startswith(answers):
                    return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{name} did not answer on port {port}")


class RedisServer:
    def __init__(self, port: int | None = None, args: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.args = args or []   # more redis-server options (ACL users, ...)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (./dev setup installs it)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning",
             *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_server(self.proc, self.port, timeout)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalCluster:
    def __init__(self, nodes: int = 3, base_port: int = 0, redis_url: str | None = None,
                 env: dict[str, str] | None = None, echo: bool = False,
                 node_env: list[dict[str, str]] | None = None,
                 redis_args: list[str] | None = None,
                 node_redis: dict[int, str] | None = None) -> None:
        self.count = nodes
        self.base_port = base_port
        self.redis: RedisServer | None = None if redis_url else RedisServer(args=redis_args)
        self.redis_url = redis_url or self.redis.url  # type: ignore[union-attr]
        self.env = env or {}
        self.node_env = node_env or []   # per node i, on top of env
        self.node_redis = node_redis or {}  # per node i: another Redis URL (a proxy, ...)
        self.echo = echo
        self.nodes: list[NodeProcess] = []

    def start(self) -> "LocalCluster":
        try:
            if self.redis is not None:
                self.redis.start()
            for i in range(self.count):
                port = self.base_port + i if self.base_port else 0
                self.nodes.append(NodeProcess(
                    "--name", f"n{i + 1}", "--port", str(port),
                    "--redis", self.node_redis.get(i, self.redis_url),
                    env={**self.env, **(self.node_env[i] if i < len(self.node_env) else {})},
                    echo=self.echo))
            for node in self.nodes:
                node.start()
            if self.count > 1:
                for node in self.nodes:  # every node has heard every other
                    node.wait_event("node_joined", timeout=15.0, count=self.count - 1)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, i: int) -> NodeProcess:
        """SIGKILL node ``i`` and start a new process under its name, port and options at
        once (as a process supervisor would); returns the new node once it serves."""
        old = self.nodes[i]
        args = list(old.args)
        args[args.index("--port") + 1] = old.url.rsplit(":", 1)[1]
        old.kill()
        new = NodeProcess(*args, env=old.env, echo=self.echo)
        self.nodes[i] = new
        return new.start()

    def stop(self) -> dict[str, Any]:
        codes = {}
        for node in self.nodes:  # all at once: they drain side by side
            node.signal(signal.SIGTERM)
        for node in self.nodes:
            codes[node.name or "?"] = node.wait_exit()
        if self.redis is not None:
            self.redis.stop()
        return codes
