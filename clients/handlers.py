"""How a provider's handler is called and how its outcome becomes a message. No I/O."""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Generator

from rpcbus import errors
from rpcbus.protocol import ERROR, MAX_ERROR_MESSAGE, REJECT, RESPONSE

log = logging.getLogger("rpcbus.handlers")

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a provider's handler may know about the call it serves."""

    rpc: str
    call_id: int          # the node's id for this attempt
    caller: str           # the calling client's name@session (or session id); with users,
                          # user/name@session where its chosen name differs from its user
    time_left: float      # seconds the caller still waits, as of arrival
    traceparent: str | None = None   # the caller's W3C trace context, when it sent one
    user: str | None = None  # the caller's authenticated user (auth mode users), set by
                             # the node; None with auth mode none


#: how a handler answers (``describe``): one value, or a stream of parts from an async
#: generator (run on the loop) or a generator (advanced in a worker thread)
ANSWERS, ASYNC_PARTS, PARTS = 0, 1, 2


def describe(handler: Handler) -> tuple[Handler, bool, bool, int]:
    """(handler, is it a coroutine function, does it take a CallContext second, how it
    answers: ANSWERS, ASYNC_PARTS or PARTS)."""
    if not callable(handler):
        raise TypeError("handler must be callable")
    method = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's method)
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(method)
    parts = (ASYNC_PARTS if inspect.isasyncgenfunction(handler)
             or inspect.isasyncgenfunction(method) else
             PARTS if inspect.isgeneratorfunction(handler)
             or inspect.isgeneratorfunction(method) else ANSWERS)
    return handler, is_async, _wants_context(handler), parts


def _wants_context(handler: Handler) -> bool:
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


async def awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class Suspended:
    """A coroutine whose first step already ran inline (clients/running.py ``start``) and
    suspended on ``step`` (what it yielded: a future, or None for a bare yield), awaitable
    once: a Task that awaits it drives the rest exactly as it would have driven the
    coroutine from its start (values sent in go on to it, exceptions thrown in, a
    cancellation among them, are thrown into it)."""

    __slots__ = ("coro", "step")

    def __init__(self, coro: Coroutine[Any, Any, Any], step: Any) -> None:
        self.coro = coro
        self.step = step

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, step = self.coro, self.step
        while True:
            try:
                sent = yield step
            except BaseException as exc:  # noqa: B036 (thrown in: the coroutine's to handle)
                try:
                    step = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    step = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def resumed(rest: Suspended) -> Any:
    return await rest


def failure(attempt: int, name: str, exc: BaseException) -> list[Any]:
    """The message for a handler that raised: REJECT for ``Reject``, the application's
    error for ``AppError``, else PROVIDER_ERROR with the exception's type and text (its
    traceback logged with the rpc's name and the call's id)."""
    if isinstance(exc, errors.Reject):
        return [REJECT, attempt]
    if isinstance(exc, errors.AppError):
        return [ERROR, attempt, errors.APP_ERROR, exc.message[:MAX_ERROR_MESSAGE],
                errors.app_error_detail(exc)]
    if isinstance(exc, asyncio.CancelledError):
        return [ERROR, attempt, errors.PROVIDER_ERROR, "the handler was cancelled"]
    log.error("handler_failed rpc=%s call_id=%s", name, attempt, exc_info=exc)
    text = str(exc)
    kind = type(exc).__name__
    return [ERROR, attempt, errors.PROVIDER_ERROR,
            (f"{kind}: {text}" if text else kind)[:MAX_ERROR_MESSAGE]]


def outcome(attempt: int, task: asyncio.Task[Any], name: str) -> list[Any]:
    """The message for a finished handler task."""
    if task.cancelled():
        return [ERROR, attempt, errors.PROVIDER_ERROR, "the handler was cancelled"]
    exc = task.exception()
    if exc is not None:
        return failure(attempt, name, exc)
    return [RESPONSE, attempt, task.result()]
