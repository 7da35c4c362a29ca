"""The Python SDK: connect to a node, provide RPCs, call them.

One ``Client`` is one WebSocket connection. Calls are correlated by ids the
client assigns; each pending call is one future in one map, removed in
``finally`` whatever happens. The node enforces every deadline; the client
keeps a safety deadline of its own (the call's timeout plus ``grace``) swept
by one task, so a call ends even if the node never answers. When the
connection is lost, every pending call fails at once with CONNECTION_LOST.

Providing: a handler gets the request's data (and, if it takes a second
positional argument, a ``CallContext``). A plain function is answered as soon
as it returns. A coroutine function runs in a Task; when it has not finished
by the end of the loop tick the node is sent ACCEPT, else the answer goes out
directly (the answer implies the accept). ``Reject`` hands the call to another
provider; any other exception answers PROVIDER_ERROR with its message, never a
traceback. A CANCEL from the node (it gave the attempt up) cancels the Task.

Cancelling ``call()`` is safe: the call is forgotten here and a late answer is
dropped. Cancelling ``provide()`` may leave the name provided on the node.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import structlog
from websockets.asyncio.client import ClientConnection, connect as ws_connect
from websockets.exceptions import WebSocketException

from . import errors
from .deadlines import Deadlines
from .protocol import (
    ACCEPT,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    ERROR,
    OK,
    PING,
    PONG,
    PROTOCOL_VERSION,
    PROVIDE,
    REJECT,
    REQUEST,
    RESPONSE,
    UNPROVIDE,
    ProtocolError,
    decode,
    valid_name,
)
from .transport import FrameIO

log = structlog.get_logger("rpcbus.client")

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a provider's handler may know about the call it serves."""

    rpc: str
    call_id: int          # the node's id for this attempt
    caller: str           # the calling client's name@session (or session id)
    time_left: float      # seconds the caller still waits, as of arrival


class _Wire(FrameIO, ClientConnection):
    """The client's websockets connection, with frames handed to the Client as they arrive."""

    owner: "Client"

    def frame_received(self, data: bytes) -> None:
        self.owner._on_frame(data)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        owner = getattr(self, "owner", None)
        if owner is not None:
            owner._on_lost(exc)

    def unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        return self.owner._unencodable(msg, exc)


class Client:
    """A connection to one node. Build it with ``clients.connect(...)``."""

    def __init__(self, url: str, *, name: str | None = None, user: str | None = None,
                 password: str | None = None, token: str | None = None,
                 open_timeout: float = 10.0, grace: float = 1.0,
                 max_size: int = 16 << 20, ping_interval: float | None = 20.0) -> None:
        self.url = url
        self.name = name
        self._credentials = {k: v for k, v in
                             (("user", user), ("password", password), ("token", token)) if v}
        self._open_timeout = open_timeout
        self._grace = grace
        self._max_size = max_size
        self._ping_interval = ping_interval
        self._wire: _Wire | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._handlers: dict[str, tuple[Handler, bool, bool]] = {}
        self._running: dict[int, asyncio.Task[Any]] = {}
        self._new_tasks: list[int] = []
        self._auth: asyncio.Future[dict[str, Any]] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._deadlines: Deadlines | None = None
        self._closed = False
        self._lost: BaseException | None = None
        self.session: dict[str, Any] = {}     # the node's AUTH_OK fields
        self._default_timeout = 10.0

    # -- life ----------------------------------------------------------------------------

    async def _open(self) -> "Client":
        loop = asyncio.get_running_loop()
        self._deadlines = Deadlines(0.05, loop.time())
        try:
            async with asyncio.timeout(self._open_timeout):
                wire = await ws_connect(self.url, create_connection=_Wire, compression=None,
                                        max_size=self._max_size,
                                        ping_interval=self._ping_interval,
                                        open_timeout=self._open_timeout)
                wire.owner = self
                self._wire = wire
                self._auth = loop.create_future()
                params: dict[str, Any] = {"protocol": PROTOCOL_VERSION, **self._credentials}
                if self.name:
                    params["name"] = self.name
                wire.send([AUTH, params])
                self.session = await self._auth
        except (OSError, TimeoutError, WebSocketException) as exc:
            await self._abort()
            raise errors.ConnectionLostError(None, f"cannot connect to {self.url}: {exc}") from exc
        except BaseException:
            await self._abort()
            raise
        self._default_timeout = self.session.get("response_timeout_ms", 10000) / 1000
        self._sweeper = loop.create_task(self._sweep_forever(), name="rpcbus-client-sweeper")
        return self

    async def _abort(self) -> None:
        self._closed = True
        if self._wire is not None:
            self._wire.transport.abort()

    async def close(self) -> None:
        """Close the connection; pending calls fail with CONNECTION_LOST. Idempotent."""
        if self._wire is not None and not self._closed:
            self._wire.flush()
            await self._wire.close()
        self._closed = True
        self._fail_all(errors.ConnectionLostError(None, "the client was closed"))

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- calling -------------------------------------------------------------------------

    async def call(self, name: str, data: Any = None, *, timeout: float | None = None) -> Any:
        """Call ``name`` with ``data``; returns the provider's answer or raises RpcError.

        ``timeout`` (seconds) bounds the whole call at the node; default: the
        node's response timeout.
        """
        if self._closed:
            raise errors.ConnectionLostError(None, "the connection is closed")
        loop = self._wire.loop
        cid = next(self._ids)
        fut = loop.create_future()
        if timeout is None:
            timeout_ms = None
            guard = self._default_timeout
        else:
            if timeout <= 0:
                raise ValueError("timeout must be positive")
            timeout_ms = int(timeout * 1000) or 1
            guard = timeout
        self._deadlines.add(cid, loop.time() + guard + self._grace)
        self._pending[cid] = fut
        self._wire.send([REQUEST, cid, name, data, timeout_ms])
        try:
            return await fut
        finally:
            self._pending.pop(cid, None)

    # -- providing -----------------------------------------------------------------------

    async def provide(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler`` until ``unprovide`` or close."""
        if not valid_name(name, int(self.session.get("max_name", 128))):
            raise ValueError(f"invalid rpc name {name!r}")
        if not callable(handler):
            raise TypeError("handler must be callable")
        is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))
        self._handlers[name] = (handler, is_async, _wants_context(handler))
        try:
            await self._control(PROVIDE, [name])
        except BaseException:
            self._handlers.pop(name, None)
            raise

    async def unprovide(self, name: str) -> None:
        """Stop serving ``name``; calls already running finish."""
        await self._control(UNPROVIDE, [name])
        self._handlers.pop(name, None)

    async def ping(self) -> None:
        """A protocol-level round trip to the node."""
        await self._control(PING, None)

    async def _control(self, kind: int, names: list[str] | None) -> Any:
        if self._closed:
            raise errors.ConnectionLostError(None, "the connection is closed")
        loop = self._wire.loop
        ref = next(self._ids)
        fut = loop.create_future()
        self._deadlines.add(ref, loop.time() + self._open_timeout)
        self._pending[ref] = fut
        self._wire.send([kind, ref] if names is None else [kind, ref, names])
        try:
            return await fut
        finally:
            self._pending.pop(ref, None)

    # -- frames in -----------------------------------------------------------------------

    def _on_frame(self, data: bytes) -> None:
        try:
            msgs = decode(data)
        except ProtocolError as exc:
            log.warning("bad_frame_from_node", url=self.url, error=str(exc))
            return
        for msg in msgs:
            try:
                self._on_message(msg)
            except Exception:  # a malformed message from the node must not kill the client
                log.exception("bad_message_from_node", url=self.url, kind=msg[0])
        if self._new_tasks:
            self._wire.loop.call_soon(self._ack_new_tasks)

    def _on_message(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind == RESPONSE or kind == OK:
            self._settle(msg[1], msg[2] if kind == RESPONSE else None, None)
        elif kind == REQUEST:
            self._serve(msg[1], msg[2], msg[3], msg[4], msg[5])
        elif kind == ERROR:
            ref, code, message = msg[1], msg[2], msg[3]
            if ref is None or ref not in self._pending:
                log.warning("node_error", url=self.url, code=code, error=message, ref=ref)
            else:
                self._settle(ref, None, errors.error_from_code(code, message))
        elif kind == CANCEL:
            task = self._running.pop(msg[1], None)
            if task is not None:
                task.cancel()
        elif kind == PING:
            self._wire.send([PONG, msg[1] if len(msg) > 1 else None])
        elif kind == PONG:
            if len(msg) > 1 and type(msg[1]) is int:
                self._settle(msg[1], None, None)
        elif kind == AUTH_OK:
            if self._auth is not None and not self._auth.done():
                self._auth.set_result(msg[1])
        elif kind == AUTH_FAIL:
            if self._auth is not None and not self._auth.done():
                self._auth.set_exception(errors.error_from_code(msg[1], msg[2]))

    def _settle(self, ref: int, result: Any, exc: BaseException | None) -> None:
        fut = self._pending.pop(ref, None)
        if fut is None:
            return  # cancelled or timed out here already: a late answer
        if not fut.done():
            if exc is None:
                fut.set_result(result)
            else:
                fut.set_exception(exc)

    # -- serving -------------------------------------------------------------------------

    def _serve(self, attempt: int, name: str, data: Any, time_left_ms: int, caller: str) -> None:
        wire = self._wire
        entry = self._handlers.get(name)
        if entry is None:  # unprovided a moment ago: let another provider have it
            wire.send([REJECT, attempt])
            return
        handler, is_async, wants_ctx = entry
        try:
            if wants_ctx:
                result = handler(data, CallContext(name, attempt, caller, time_left_ms / 1000))
            else:
                result = handler(data)
        except Exception as exc:
            wire.send(_failure(attempt, name, exc))
            return
        if not is_async and not inspect.isawaitable(result):
            wire.send([RESPONSE, attempt, result])
            return
        task = wire.loop.create_task(_awaited(result))
        self._running[attempt] = task
        self._new_tasks.append(attempt)
        task.add_done_callback(lambda t, a=attempt, n=name: self._task_done(a, n, t))

    def _ack_new_tasks(self) -> None:
        """End of the tick that started handler tasks: answer the finished, ACCEPT the rest."""
        new, self._new_tasks = self._new_tasks, []
        for attempt in new:
            task = self._running.get(attempt)
            if task is None:
                continue
            if task.done():
                del self._running[attempt]
                self._wire.send(_outcome(attempt, task))
            else:
                self._wire.send([ACCEPT, attempt])

    def _task_done(self, attempt: int, name: str, task: asyncio.Task[Any]) -> None:
        if self._running.pop(attempt, None) is None or self._closed:
            return  # answered already, cancelled by the node, or the connection is gone
        self._wire.send(_outcome(attempt, task, name))

    def _unencodable(self, msg: list[Any], exc: Exception) -> list[Any] | None:
        kind = msg[0]
        if kind == RESPONSE:
            return [ERROR, msg[1], errors.PROVIDER_ERROR, f"result is not serializable: {exc}"]
        fut = self._pending.pop(msg[1], None) if kind == REQUEST else None
        if fut is not None and not fut.done():
            fut.set_exception(TypeError(f"call data is not serializable: {exc}"))
        return None

    # -- failure -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.05)
            for ref in self._deadlines.expire(loop.time()):
                fut = self._pending.pop(ref, None)
                if fut is not None and not fut.done():
                    fut.set_exception(errors.ResponseTimeoutError(
                        None, "no answer from the node within the deadline"))

    def _on_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self._fail_all(errors.ConnectionLostError(
            None, f"connection to {self.url} lost" + (f": {exc}" if exc else "")))

    def _fail_all(self, exc: errors.RpcError) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._auth is not None and not self._auth.done():
            self._auth.set_exception(exc)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
        running, self._running = self._running, {}
        for task in running.values():
            task.cancel()


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _wants_context(handler: Handler) -> bool:
    """True when the handler takes a second positional argument (the CallContext)."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _failure(attempt: int, name: str, exc: BaseException) -> list[Any]:
    if isinstance(exc, errors.Reject):
        return [REJECT, attempt]
    if isinstance(exc, asyncio.CancelledError):
        return [ERROR, attempt, errors.PROVIDER_ERROR, "the handler was cancelled"]
    log.warning("handler_failed", rpc=name, error=f"{type(exc).__name__}: {exc}")
    return [ERROR, attempt, errors.PROVIDER_ERROR, str(exc) or type(exc).__name__]


def _outcome(attempt: int, task: asyncio.Task[Any], name: str = "") -> list[Any]:
    if task.cancelled():
        return [ERROR, attempt, errors.PROVIDER_ERROR, "the handler was cancelled"]
    exc = task.exception()
    if exc is not None:
        return _failure(attempt, name, exc)
    return [RESPONSE, attempt, task.result()]


class _Connector:
    """What ``connect`` returns: await it for a Client, or use it with ``async with``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __await__(self) -> Any:
        return self._client._open().__await__()

    async def __aenter__(self) -> Client:
        return await self._client._open()

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.close()


def connect(url: str, **options: Any) -> _Connector:
    """Connect to the node at ``url`` (``ws://host:port``); see ``Client`` for options.

    ``async with clients.connect(url) as c: ...`` or ``c = await clients.connect(url)``.
    Raises ConnectionLostError when the node cannot be reached, and the node's
    AUTH_FAIL as an RpcError.
    """
    return _Connector(Client(url, **options))
