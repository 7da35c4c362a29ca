"""What a node answers plain HTTP requests on its client port with (``Node.http``).

``GET /healthz`` and ``/readyz`` (probes, always open), ``/stats``, ``/metrics``,
``/cluster``, ``/dashboard`` and ``POST /reload`` (with ``server.admin_token_sha256``
set, only for requests with that token: ``Authorization: Bearer`` or ``?token=``);
a request to upgrade goes on to the WebSocket handshake (None), unless the node is
draining or still starting (503).
"""

from __future__ import annotations

import hmac
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from rpcbus.broker.auth import token_digest
from rpcbus.handshake import HttpRequest
from rpcbus.websocket import HttpAnswer

if TYPE_CHECKING:
    from rpcbus.broker.node import Node

ADMIN_PATHS = frozenset({"/metrics", "/stats", "/cluster", "/dashboard", "/reload"})


def answer(node: Node, request: HttpRequest) -> HttpAnswer | None:
    """The answer to a plain HTTP request on ``node``'s client port, or None to take it
    as a WebSocket client."""
    path = request.path.split("?", 1)[0]
    if path == "/healthz":
        if node.ready:
            return _text(200, "ok")
        return _text(503, "draining" if node.draining else "starting")
    if path in ADMIN_PATHS and not _admin(node, request):
        return _text(401, "this endpoint needs the admin token: "
                          "Authorization: Bearer <token> or ?token=<token>")
    if path == "/cluster":
        return _json(node.cluster_view())
    if path == "/dashboard":
        from rpcbus.broker.dashboard import PAGE

        return 200, PAGE.encode(), {"Content-Type": "text/html; charset=utf-8"}
    if path == "/readyz":
        why = node.not_ready()
        return _text(503 if why else 200, why or "ready")
    if path == "/stats":
        return _json(node.snapshot())
    if path == "/metrics":
        from rpcbus.broker.metrics import CONTENT_TYPE, render

        return 200, render(node), {"Content-Type": CONTENT_TYPE}
    if path == "/reload":
        if request.method != "POST":
            return _text(405, "POST /reload, with the admin token")
        if not node.config.server.admin_token_sha256:
            return _text(403, "set server.admin_token_sha256 to reload over HTTP (or "
                              "send the node SIGHUP)")
        applied, line = node.reload()
        return _text(200 if applied else 400, line)
    if not request.wants_websocket:  # a browser, curl
        if path == "/":
            return 302, b"see /dashboard\n", {"Location": "/dashboard"}
        return _text(404, "not found: this port serves WebSocket clients and /healthz "
                          "/readyz /metrics /stats /cluster /dashboard")
    return not_taking(node)  # else the WebSocket handshake


def not_taking(node: Node) -> HttpAnswer | None:
    """503 for a new client (either protocol) while ``node`` drains or starts, else None."""
    if node.draining:  # still listening, so that /readyz can say so; no new clients
        return _text(503, "draining: connect to another node")
    if not node.ready:  # waiting for the cluster bus (the SDKs try again)
        return _text(503, "starting: try again shortly")
    return None


def _admin(node: Node, request: HttpRequest) -> bool:
    """The request may read the admin endpoints (no token configured: anyone may)."""
    digest = node.config.server.admin_token_sha256
    if not digest:
        return True
    header = request.headers.get("authorization", "")
    token = header[7:] if header.startswith("Bearer ") else ""
    if not token and "?" in request.path:
        query = urllib.parse.parse_qs(request.path.split("?", 1)[1])
        token = query.get("token", [""])[0]
    return hmac.compare_digest(token_digest(token), digest)


def _text(status: int, text: str) -> HttpAnswer:
    return status, text.encode() + b"\n", {}


def _json(value: Any) -> HttpAnswer:
    return 200, json.dumps(value).encode() + b"\n", {"Content-Type": "application/json"}
