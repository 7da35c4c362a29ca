"""systemd's readiness protocol (sd_notify): a node run as a ``Type=notify`` service says
when it is ready, reloading and stopping (conf/rpcbus.service).

Each notice is one datagram of ``KEY=VALUE`` lines to the Unix socket named by
``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace). Without it,
nothing is sent. A notice that cannot be sent is logged once and dropped: a node
never stops or blocks for its supervisor.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Mapping

import structlog

log = structlog.get_logger(module="rpcbus.notify")


class Notifier:
    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = ("\0" + path[1:] if path.startswith("@")
                                    else path if path.startswith("/") else None)
        self._sock: socket.socket | None = None
        self._failed = False

    def send(self, **fields: str) -> bool:
        """One notice (``READY="1"``, ``STATUS="..."``); True when it left."""
        if self.address is None:
            return False
        payload = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self.address)
            return True
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("systemd_notify_failed", socket=self.address, error=str(exc))
            return False

    def ready(self, status: str) -> None:
        self.send(READY="1", STATUS=status)

    def reloading(self) -> None:
        # MONOTONIC_USEC: systemd 253+ matches the notice with the reload it asked for
        self.send(RELOADING="1", MONOTONIC_USEC=str(int(time.monotonic() * 1e6)),
                  STATUS="reloading its configuration")

    def stopping(self, status: str) -> None:
        self.send(STOPPING="1", STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
