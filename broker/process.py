"""Start and stop a node as a child process: for the demo, the benchmarks and the tests.

The child logs JSON lines on stderr; a reader thread keeps the last lines (and appends
every line to ``log_file``, when given) and notices ``node_ready`` (which carries the
URL, so ``--port 0`` works).
Without ``--config`` or ``RPCBUS_AUTH_MODE`` the child runs with auth mode
``none``, set explicitly: these are development nodes on loopback.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any


class NodeStartError(RuntimeError):
    """A node process did not become ready; the message is the node's own reason."""


class NodeProcess:
    """One ``rpcbus node`` child; ``start()`` returns once it serves, ``stop()`` drains it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None,
                 echo: bool = False, wrapper: list[str] | None = None,
                 log_file: str | None = None) -> None:
        self.args = ["--port", "0", *args] if "--port" not in args else list(args)
        self.env = {**os.environ, "RPCBUS_LOG_FORMAT": "json", **(env or {})}
        if "--config" not in args and "RPCBUS_AUTH_MODE" not in self.env:
            self.env["RPCBUS_AUTH_MODE"] = "none"  # a development node: auth off, explicitly
        self.echo = echo
        self.wrapper = wrapper or []   # a command the node runs under (e.g. valgrind ...)
        self.log_file = log_file       # every line the node logs is appended there too
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.name = ""
        self.lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=2000)
        self._ready = threading.Event()
        self._closed_stderr = False  # it closed its stderr: it is exiting, or has
        self._new_line = threading.Condition()

    def start(self, timeout: float = 30.0) -> "NodeProcess":
        self.proc = subprocess.Popen(
            [*self.wrapper, sys.executable, "-m", "rpcbus.broker", "node", *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=self.env)
        threading.Thread(target=self._read, daemon=True, name="node-log-reader").start()
        if not self._ready.wait(timeout) or not self.url:
            code = self.proc.poll()
            if code is None and self._closed_stderr:  # exiting: its code comes in a moment
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.proc.wait(5)
            self.kill()
            if code is not None:
                raise NodeStartError(f"the node exited with code {code} before it was ready: "
                                     f"{self.last_error()}")
            raise NodeStartError(f"the node was not ready within {timeout:g} s: "
                                 f"{self.last_error()}")
        return self

    def last_error(self) -> str:
        """The node's own words for what went wrong: its last error line (a log line at
        error level, or the CLI's one-line ``Error: ...``), else its last line."""
        lines = list(self.lines)
        for line in reversed(lines):
            if line.get("event") == "raw" and line.get("text", "").startswith("Error:"):
                return str(line["text"])[len("Error:"):].strip()
            if line.get("level") in ("error", "critical"):
                detail = line.get("error") or line.get("hint") or ""
                return f"{line.get('event')}: {detail}".rstrip(": ")
        return json.dumps(lines[-1]) if lines else "it printed nothing"

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with self.proc.stderr:  # closed at EOF: the node exited
            self._read_lines(self.proc.stderr)
        self._closed_stderr = True
        self._ready.set()  # exited: let start() report it

    def _read_lines(self, stream: Any) -> None:
        log = open(self.log_file, "a", buffering=1) if self.log_file else None
        try:
            self._lines(stream, log)
        finally:
            if log is not None:
                log.close()

    def _lines(self, stream: Any, log: Any) -> None:
        for raw in stream:
            text = raw.decode(errors="replace").rstrip()
            if self.echo:
                print(text, file=sys.stderr)
            if log is not None:
                log.write(text + "\n")
            try:
                line = json.loads(text)
            except ValueError:
                line = {"event": "raw", "text": text}
            if not isinstance(line, dict):
                line = {"event": "raw", "text": text}
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()
            if line.get("event") == "node_ready":
                self.url, self.name = line["url"], line["node"]
                self._ready.set()

    def wait_event(self, name: str, timeout: float = 10.0, count: int = 1,
                   **fields: Any) -> dict[str, Any]:
        """Block until the node has logged event ``name`` with these fields ``count`` times;
        returns the last such line; raises TimeoutError."""
        def found() -> dict[str, Any] | None:
            seen = [line for line in list(self.lines) if line.get("event") == name
                    and all(line.get(k) == v for k, v in fields.items())]
            return seen[-1] if len(seen) >= count else None

        with self._new_line:
            if not self._new_line.wait_for(found, timeout):
                raise TimeoutError(f"node logged no {name} {fields} within {timeout}s")
            return found()  # type: ignore[return-value]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if line.get("event") == name]

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (graceful drain), then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc is None:
            return 0
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 20.0) -> int:
        """Wait for the node to exit (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            return 0
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "NodeProcess":
        return self if self.proc is not None else self.start()  # started already: as is

    def __exit__(self, *exc: Any) -> None:
        self.stop()
