"""The JavaScript SDK (clients/js) against real node processes: a Node.js agent
(clients/js/test/agent.js) driven over its stdin/stdout, one JSON line per command."""

import asyncio
import contextlib
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest

from ..timing import wait as scaled

JS = Path(__file__).resolve().parents[2] / "clients" / "js"


def node_exe():
    """Node.js and the SDK's packages, or a skip (a failure under CI: ./dev test installs them)."""
    exe = shutil.which("node")
    missing = ("node" if exe is None else
               "the SDK's packages (npm ci)" if not (JS / "node_modules" / "@msgpack").is_dir()
               else None)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} missing: ./dev test installs it")
        pytest.skip(f"{missing} missing (./dev test installs it)")
    return exe


class JsAgent:
    """One Node.js process holding one rpcbus JS client."""

    def __init__(self, proc):
        self.proc = proc
        self.events = []
        self._ids = itertools.count(1)
        self._waiting = {}
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self):
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            if "event" in msg:
                self.events.append(msg)
                self._changed.set()
            else:
                self._waiting.pop(msg["id"]).set_result(msg)

    async def send(self, op, wait=15.0, **fields):
        """The command's answer: {"ok": value} or {"error": {code, name, message}}, within
        ``wait`` seconds (``timeout`` is a field of the command: a call's, in ms)."""
        cid = next(self._ids)
        fut = self._waiting[cid] = asyncio.get_running_loop().create_future()
        self.proc.stdin.write(json.dumps({"id": cid, "op": op, **fields}).encode() + b"\n")
        async with asyncio.timeout(scaled(wait)):
            return await fut

    async def ok(self, op, **fields):
        answer = await self.send(op, **fields)
        assert "ok" in answer, answer
        return answer["ok"]

    async def error(self, op, **fields):
        answer = await self.send(op, **fields)
        assert "error" in answer, answer
        return answer["error"]

    async def event(self, predicate, timeout=10.0):
        """The first event (seen or to come) for which ``predicate`` is true."""
        async with asyncio.timeout(scaled(timeout)):
            while True:
                for e in self.events:
                    if predicate(e):
                        return e
                self._changed.clear()
                await self._changed.wait()

    async def stop(self):
        if self.proc.returncode is None:
            self.proc.stdin.close()          # the agent closes its client and exits
            try:
                async with asyncio.timeout(scaled(5)):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._reader.cancel()
        return self.proc.returncode, (await self.proc.stderr.read()).decode()


@contextlib.asynccontextmanager
async def agents(*argv, cwd=None, what="JS agent"):
    """``start()`` runs ``argv`` as a JsAgent; on leaving, each must exit 0 and have
    printed nothing on stderr."""
    started = []

    async def start():
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        started.append(JsAgent(proc))
        return started[-1]

    yield start
    for agent in started:
        code, err = await agent.stop()
        assert code == 0 and not err, f"the {what} exited {code}: {err}"


@pytest.fixture
async def js():
    """Start JS agents: ``agent = await js()``; each must exit 0 without errors."""
    async with agents(node_exe(), str(JS / "test" / "agent.js")) as start:
        yield start
