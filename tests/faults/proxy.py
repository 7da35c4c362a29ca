"""A TCP proxy of our own between one node and Redis, to inject network faults.

It runs in a child process: in a thread of the test process it competed for the
GIL with the load, and when failing calls turned the load into a busy loop it
delayed the node's Redis traffic by most of a second — a fault the test never
injected (a node "deaf" again and again after the fault had cleared).
Faults, each switched on and off from the test: ``blackhole(True)`` swallows
everything Redis sends the node (the node can still publish: it cannot hear),
``delay(s)`` holds every chunk in both directions for ``s`` seconds, ``reset()``
aborts every open connection (the node reconnects). Each returns once the child
has applied it. Loopback only.

    python -m tests.faults.proxy LISTEN_PORT TARGET_PORT   # commands on stdin
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from rpcbus.broker.local import free_port


class _Pipe(asyncio.Protocol):
    """One direction's receiving end; what it reads goes to ``peer`` (another _Pipe)."""

    def __init__(self, faults: "_Faults", downstream: bool) -> None:
        self.faults = faults
        self.downstream = downstream   # True: Redis -> node
        self.transport: Any = None
        self.peer: _Pipe | None = None
        self.buffer: list[bytes] = []  # what arrived before the peer was connected

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.faults.open.add(self)

    def data_received(self, data: bytes) -> None:
        faults = self.faults
        if self.downstream and faults.blackholed:
            return
        if faults.latency:
            asyncio.get_running_loop().call_later(faults.latency, self._forward, data)
        else:
            self._forward(data)

    def _forward(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.buffer.append(data)
        elif not peer.transport.is_closing():
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.faults.open.discard(self)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Faults:
    """The child's state: what is switched on, and the open pipes."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.blackholed = False
        self.latency = 0.0
        self.open: set[_Pipe] = set()

    def accepted(self) -> _Pipe:
        up = _Pipe(self, downstream=False)           # node -> Redis: read from the node

        async def connect() -> None:
            try:
                _, down = await asyncio.get_running_loop().create_connection(
                    lambda: _Pipe(self, downstream=True), "127.0.0.1", self.target_port)
            except OSError:
                if up.transport is not None:
                    up.transport.close()
                return
            up.peer, down.peer = down, up
            for chunk in up.buffer:
                down.transport.write(chunk)
            up.buffer.clear()

        asyncio.get_running_loop().create_task(connect())
        return up

    def apply(self, command: str) -> None:
        word, _, arg = command.partition(" ")
        if word == "blackhole":
            self.blackholed = arg == "1"
        elif word == "delay":
            self.latency = float(arg)
        elif word == "reset":
            for pipe in list(self.open):
                pipe.transport.abort()
        else:
            raise ValueError(f"unknown command {command!r}")


async def _serve(listen_port: int, target_port: int) -> None:
    faults = _Faults(target_port)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(faults.accepted, "127.0.0.1", listen_port)
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    print("ready", flush=True)
    while line := (await commands.readline()).decode().strip():  # EOF: the test is done
        faults.apply(line)
        print("ok", flush=True)
    server.close()
    for pipe in list(faults.open):
        pipe.transport.abort()


class Proxy:
    """``Proxy(target_port).start()``; ``url`` is the Redis URL a node should use."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "Proxy":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.proxy", str(self.port), str(self.target_port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready")
        return self

    def _expect(self, word: str) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # a child on loopback: answers at once
        if line != word:
            raise RuntimeError(f"fault proxy said {line!r}, not {word!r}")

    def _send(self, command: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self._expect("ok")

    def blackhole(self, on: bool) -> None:
        self._send(f"blackhole {int(on)}")

    def delay(self, seconds: float) -> None:
        self._send(f"delay {seconds}")

    def reset(self) -> None:
        """Abort every connection through the proxy now."""
        self._send("reset")

    def stop(self) -> None:
        """EOF on its stdin: the child closes and exits (killed after 5 s); pipes closed."""
        proc = self.proc
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        if not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2])))
