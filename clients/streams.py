"""Streams in the SDK's shell: ``Stream``, what ``Client.stream`` returns, and
``serve_parts``, which runs a provider's generator for one STREAM. The flow control is
clients/streaming.py's; the client (clients/client.py) routes the messages.

A stream is a call whose answer comes in parts: the caller's rules are a call's
(``rpcbus.calling.Calls``: it waits for a connection, is sent again elsewhere when a
node refuses it unrun, ends by its deadline, fails ``CONNECTION_LOST`` with its
connection) and its end (RESPONSE, ERROR, a timeout) settles one future, as a call's
answer does; the parts go to its ``Flow``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

from rpcbus.protocol import PART
from rpcbus.streaming import Inflow, Outflow

if TYPE_CHECKING:
    from rpcbus.client import Client


class Flow:
    """One open stream of a client, kept by its call id: the parts read ahead of the
    application (``inflow``), the future its end settles (``ended``, in the client's
    table of pending calls) and the application's wait for either (``wake``)."""

    __slots__ = ("cid", "inflow", "ended", "wake")

    def __init__(self, cid: int, window: int, ended: asyncio.Future[Any]) -> None:
        self.cid = cid
        self.inflow = Inflow(window)
        self.ended = ended
        self.wake: asyncio.Future[None] | None = None
        ended.add_done_callback(self._ended)

    def arrived(self, data: Any) -> bool:
        """A PART: kept for the application; False when it is past the window."""
        if not self.inflow.arrived(data):
            return False
        self._wake()
        return True

    def _ended(self, _: Any) -> None:
        self._wake()

    def _wake(self) -> None:
        wake, self.wake = self.wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)


class Stream:
    """The parts of one stream, in order: ``async for part in client.stream(...)``.

    The stream opens at the first ``__anext__`` (or ``async with``). Iteration ends when
    the provider's generator ends; an error (the provider's exception after the parts
    it sent, ``PROVIDER_GONE``, ``RESPONSE_TIMEOUT`` at the deadline, ...) is raised once
    the parts that came before it are read. Leaving early — ``break`` (the stream is
    closed as it is dropped), ``aclose()``, leaving ``async with``, or cancelling the task
    that waits for a part — sends CANCEL: the provider's generator is closed, on any node.
    """

    def __init__(self, client: "Client", name: str, data: Any, timeout: float | None,
                 window: int, traceparent: str | None) -> None:
        self._client = client
        self._args = (name, data, timeout, window, traceparent)
        self._flow: Flow | None = None
        self._done = False

    def __aiter__(self) -> "Stream":
        return self

    async def __anext__(self) -> Any:
        if self._done:  # ended, or closed: as a finished generator
            raise StopAsyncIteration
        flow = self._flow
        if flow is None:
            flow = self._flow = self._client._open_stream(*self._args)
        while True:
            inflow = flow.inflow
            if inflow.parts:
                part, credit = inflow.take()
                if credit:
                    self._client._credit(flow.cid, credit)
                return part
            ended = flow.ended
            if ended.done():
                self._finish(flow)
                exc = ended.exception()
                if exc is not None:
                    raise exc
                raise StopAsyncIteration
            wake = flow.wake = asyncio.get_running_loop().create_future()
            try:
                await wake
            except asyncio.CancelledError:
                self.close()  # the application gave up: so does the provider
                raise

    async def __aenter__(self) -> "Stream":
        if self._flow is None and not self._done:
            self._flow = self._client._open_stream(*self._args)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    async def aclose(self) -> None:
        """Stop reading: the provider is told (CANCEL) unless the stream has ended."""
        self.close()

    def close(self) -> None:
        """``aclose``, for code that cannot await (it does nothing that waits)."""
        flow = self._flow
        if self._done or flow is None:
            self._done = True
            return
        self._client._abandon_stream(flow)
        self._finish(flow)

    def _finish(self, flow: Flow) -> None:
        self._done = True
        self._client._forget_stream(flow)

    def __del__(self) -> None:
        # dropped unfinished (``break`` out of ``async for``): the provider is told
        if not self._done and self._flow is not None:
            try:
                self.close()
            except Exception:  # noqa: S110 (a closed loop at exit: nothing to tell)
                pass


async def serve_parts(send: Any, attempt: int, flow: Outflow,
                      parts: AsyncIterator[Any]) -> None:
    """Send a STREAM's ``parts`` as PARTs while ``flow`` has credit, waiting for CREDIT
    when it has none: a caller that stops reading stops the generator. Returns when the
    parts end (the shell then sends RESPONSE, which ends the stream); what the
    generator raises propagates (the shell sends its ERROR). Cancelled (the node's
    CANCEL: the caller gave up, or the deadline passed), the generator is closed."""
    try:
        while True:
            while flow.credit <= 0:
                flow.waiter = asyncio.get_running_loop().create_future()
                await flow.waiter
            try:
                part = await parts.__anext__()
            except StopAsyncIteration:
                return
            flow.sent += 1
            send([PART, attempt, part])
    finally:
        await parts.aclose()  # type: ignore[attr-defined]  # both kinds of ours have it


class Threaded:
    """A generator advanced in a worker thread (``pool``), as an async iterator: one
    ``next`` at a time, and ``aclose`` waits for the one under way before it closes."""

    _END = object()

    def __init__(self, parts: Iterator[Any], pool: concurrent.futures.Executor) -> None:
        self._parts = parts
        self._pool = pool
        self._running: concurrent.futures.Future[Any] | None = None

    def __aiter__(self) -> "Threaded":
        return self

    async def __anext__(self) -> Any:
        self._running = self._pool.submit(functools.partial(next, self._parts, self._END))
        part = await asyncio.wrap_future(self._running)
        if part is self._END:
            raise StopAsyncIteration
        return part

    async def aclose(self) -> None:
        running = self._running
        if running is not None and not running.done():
            await asyncio.wait([asyncio.wrap_future(running)])
        close = getattr(self._parts, "close", None)
        if close is not None:
            await asyncio.wrap_future(self._pool.submit(close))


async def one_part(send: Any, attempt: int, answer: Any) -> None:
    """A plain handler called as a stream: its answer (awaited) is the one part."""
    send([PART, attempt, await answer])
