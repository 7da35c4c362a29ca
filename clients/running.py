"""How the client runs its handlers, once the provider rules (clients/provider.py
``Serving``) took a REQUEST or STREAM and its ACCEPT went out: the shell's half of
serving.

A coroutine function's first step runs on the loop at once (most answer without
suspending, and then no Task is made at all); a plain function runs in one of the
client's worker threads (``handler_threads``), never after its call's deadline, which
it then refuses BUSY, unrun; a handler that answers in parts is driven by
clients/streams.py. What a handler returns or raises becomes the answer
(clients/handlers.py ``outcome``). Cancelling a handler's Task (the node's CANCEL, the
connection lost) is ``Serving``'s: its answer, if any, is then not sent.

``workers_full`` is the rule the provider rules ask before taking a REQUEST for a
plain function: by the handlers' smoothed time, would the ones queued before it hold
it past half its time left? Then it is refused BUSY and the node holds the call
instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import time
from types import CoroutineType
from typing import Any, Protocol

from rpcbus import errors
from rpcbus.handlers import (
    ANSWERS,
    ASYNC_PARTS,
    CallContext,
    Handler,
    Suspended,
    awaited,
    failure,
    outcome,
    resumed,
)
from rpcbus.protocol import (
    ERROR,
    REJECT,
    REJECT_BUSY,
    REQ_CALLER,
    REQ_DATA,
    REQ_SENT_MS,
    REQ_TIME_LEFT_MS,
    REQ_TRACEPARENT,
    REQ_USER,
    REQ_WINDOW,
    RESPONSE,
    STREAM,
)
from rpcbus.provider import Serving
from rpcbus.streams import Threaded, one_part, serve_parts

log = logging.getLogger("rpcbus.client")  # the client's: one logger for the SDK

Entry = tuple[Handler, bool, bool, int]  # a provided name's handler, as ``describe`` gives


class Wire(Protocol):
    """The connection a call came on, as far as running its handler goes."""

    loop: asyncio.AbstractEventLoop
    serving: Serving

    def send(self, msg: list[Any]) -> None: ...


class Runner:
    """The handlers of one client: its worker threads and what it counts of them."""

    __slots__ = ("busy_requests", "expired_handlers", "frame_jobs", "threads", "_pool",
                 "_service", "_thread_jobs")

    def __init__(self, threads: int) -> None:
        self.threads = threads                # worker threads, at most
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # made when needed
        self.busy_requests = 0                # REQUESTs refused unrun: workers all taken
        self.expired_handlers = 0             # handlers not started: their deadline passed
        self._thread_jobs = 0                 # plain-function handlers queued or running
        self._service = 0.0                   # s one of them takes, smoothed
        self.frame_jobs = 0                   # those taken in the frame being read

    def close(self) -> None:
        """The client closes: handlers not yet in a thread never run."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def start(self, wire: Wire, attempt: int, name: str, entry: Entry,
              request: list[Any]) -> None:
        """Run an accepted call's handler: a coroutine function's first step here (its
        answer is sent at once when it did not suspend; else a Task drives the rest), a
        plain function in a worker thread; a Task's outcome is sent when it ends
        (``_task_done``)."""
        handler, is_async, wants_context, parts = entry
        data = request[REQ_DATA]
        n = len(request)
        args = (data, CallContext(name, attempt, request[REQ_CALLER],
                                  request[REQ_TIME_LEFT_MS] / 1000,
                                  request[REQ_TRACEPARENT] if n > REQ_TRACEPARENT else None,
                                  request[REQ_USER] if n > REQ_USER else None)
                ) if wants_context else (data,)
        if parts != ANSWERS or request[0] == STREAM:
            self._start_stream(wire, attempt, name, entry, request, args)
            return
        if is_async:
            # Its first step runs here, in a context of its own as a Task's would: most
            # handlers answer without suspending, and then no Task is made at all.
            context = contextvars.copy_context()
            try:
                work = handler(*args)
                if isinstance(work, CoroutineType):  # inspect.iscoroutine, one frame less
                    try:  # up to its first suspension, here, in its own context
                        step = context.run(work.send, None)
                    except StopIteration as stop:  # it returned without suspending
                        wire.send([RESPONSE, attempt, stop.value])
                        return
                    work = resumed(Suspended(work, step))
                else:
                    work = awaited(work)
            except (Exception, asyncio.CancelledError) as exc:
                wire.send(failure(attempt, name, exc))
                return
            task = wire.loop.create_task(work, context=context)
        else:
            task = wire.loop.create_task(
                self._in_thread(handler, args, _deadline(wire, request)))
        wire.serving.started(attempt, task)
        task.add_done_callback(functools.partial(self._task_done, wire, attempt, name))

    def _start_stream(self, wire: Wire, attempt: int, name: str, entry: Entry,
                      request: list[Any], args: tuple[Any, ...]) -> None:
        """A STREAM, or a REQUEST for a handler that answers in parts (refused: its caller
        is told to use ``stream()``). A generator's parts go out as credit allows
        (``serve_parts``); a plain handler's answer is the one part."""
        handler, is_async, _, parts = entry
        if request[0] != STREAM:
            wire.send([ERROR, attempt, errors.PROVIDER_ERROR,
                       f"{name!r} answers in parts: call it with stream()"])
            return
        if parts == ANSWERS:
            answer = handler(*args) if is_async else self._in_thread(
                handler, args, _deadline(wire, request))
            work = one_part(wire.send, attempt, answer)
        else:
            flow = wire.serving.stream(attempt, request[REQ_WINDOW])
            try:
                gen = handler(*args)  # a generator: none of its code runs here
            except Exception as exc:
                wire.send(failure(attempt, name, exc))
                return
            work = serve_parts(wire.send, attempt, flow, gen if parts == ASYNC_PARTS
                               else Threaded(gen, self.pool()))
        task = wire.loop.create_task(work)
        wire.serving.started(attempt, task)
        task.add_done_callback(functools.partial(self._task_done, wire, attempt, name))

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The worker threads (made at the first plain-function handler)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="rpcbus-handler")
        return self._pool

    def workers_full(self, entry: Entry, left_ms: Any) -> bool:
        """A REQUEST for ``entry`` with ``left_ms`` to go comes: True when it runs in a
        worker thread and, by the handlers' smoothed time, the ones queued before it
        would hold it past half its time left, so it is refused BUSY and the node holds
        it instead (a burst of quick calls is taken); else it counts as queued now."""
        if entry[1] or entry[3] == ASYNC_PARTS:  # runs on the loop
            return False
        threads = self.threads
        ahead = self._thread_jobs + self.frame_jobs - threads + 1
        if (ahead > 0 and type(left_ms) is int
                and ahead * self._service / threads * 2000 > left_ms):
            self.busy_requests += 1
            return True
        self.frame_jobs += 1
        return False

    def _timed(self, deadline: float, handler: Handler, args: tuple[Any, ...]) -> Any:
        """In a worker thread: ``handler(*args)``, unless the call's deadline has passed;
        its time moves the smoothed one ``workers_full`` judges by."""
        start = time.monotonic()
        if start > deadline:
            raise _Expired
        try:
            return handler(*args)
        finally:
            self._service += 0.1 * (time.monotonic() - start - self._service)

    async def _in_thread(self, handler: Handler, args: tuple[Any, ...],
                         deadline: float) -> Any:
        """``handler(*args)`` in one of the client's worker threads (an awaitable it
        returns is awaited here). Cancelled before a thread took it, it never runs; nor
        does it when a thread takes it after ``deadline`` (``time.monotonic()``): its
        caller has stopped waiting (``_Expired``: the node is told BUSY, not run)."""
        self._thread_jobs += 1
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                self.pool(), functools.partial(self._timed, deadline, handler, args))
        finally:
            self._thread_jobs -= 1
        if inspect.isawaitable(result):
            result = await result
        return result

    def _task_done(self, wire: Wire, attempt: int, name: str,
                   task: asyncio.Task[Any]) -> None:
        if wire.serving.finished(attempt):  # not cancelled by the node, connection not gone
            if not task.cancelled() and type(task.exception()) is _Expired:
                self.expired_handlers += 1  # not run: the node ends it (time is up there)
                log.info("handler_not_started rpc=%s call_id=%s reason=deadline", name,
                         attempt)
                wire.send([REJECT, attempt, REJECT_BUSY])
                return
            wire.send(outcome(attempt, task, name))


def _deadline(wire: Wire, request: list[Any]) -> float:
    """The call's deadline on ``time.monotonic()``: its time left when the node sent it,
    less how long ago that was (as far as this connection can tell)."""
    now = time.monotonic()
    age = wire.serving.freshness.age_ms(request[REQ_SENT_MS], wire.loop.time())
    return now + (float(request[REQ_TIME_LEFT_MS]) - age) / 1000


class _Expired(Exception):
    """A plain-function handler's worker thread came free after the call's deadline."""
