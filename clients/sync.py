"""A blocking client for scripts and notebooks: ``rpcbus.connect_sync(url)``.

    import rpcbus

    with rpcbus.connect_sync("ws://127.0.0.1:6020") as c:
        print(c.call("math.add", {"a": 1, "b": 2}, timeout=5.0))

It is the asyncio ``Client`` run on an event loop of its own, in a background thread
(``rpcbus-sync``), so it works where a loop already runs in the calling thread (Jupyter)
and where none does (a plain script). Each method blocks the calling thread until the
client's coroutine ends and returns its result or raises its error (the same classes as
the async client's: ``rpcbus.NoProviderError``, ``ResponseTimeoutError``, ...).

Handlers: a plain function runs in a worker thread (as with the async client), so it may
block (a database, ``requests``, ``time.sleep``) and may itself call through this client;
a cancelled call (its caller gave up) cannot stop such a thread: its answer is dropped.
An ``async def`` handler runs on the client's loop and is cancelled as usual. Event
handlers (``subscribe``) that are plain functions run one at a time, in the order the
events came, in a thread of their own (``rpcbus-sync-events``): they may block too, and
events wait for them meanwhile; presence handlers (``watch_presence``) run there too.

Interrupting a blocked method (Ctrl-C: ``KeyboardInterrupt`` in the calling thread)
cancels its coroutine: an interrupted ``call`` tells the node, as a cancelled async call
does. ``close()`` (or leaving ``with``) closes the client and ends its thread; a client
never closed is stopped with the interpreter (its thread is a daemon).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Any, Coroutine, Sequence, TypeVar, Unpack

from rpcbus.calling import Reply
from rpcbus.client import Client, Options, connect
from rpcbus.events import EventHandler, GapHandler, PresenceHandler, log
from rpcbus.found import ProviderInfo, RpcInfo
from rpcbus.handlers import Handler
from rpcbus.streaming import DEFAULT_WINDOW
from rpcbus.streams import Stream

T = TypeVar("T")


class SyncClient:
    """A ``Client`` driven from blocking code. Build it with ``rpcbus.connect_sync(...)``."""

    def __init__(self, urls: str | Sequence[str], **options: Unpack[Options]) -> None:
        self._loop = asyncio.new_event_loop()
        self._events_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="rpcbus-sync",
                                        daemon=True)
        self._thread.start()
        try:
            self._client: Client = self._run(_open(urls, options))
        except BaseException:
            self._stop_loop()
            raise

    @property
    def client(self) -> Client:
        """The asyncio client underneath (its methods run on this client's loop only)."""
        return self._client

    @property
    def url(self) -> str:
        return self._client.url

    @property
    def closed(self) -> bool:
        return self._client.closed

    def call(self, name: str, data: Any = None, *, timeout: float | None = None,
             idempotent: bool = False, traceparent: str | None = None) -> Any:
        """``Client.call``, blocking: the provider's answer, or its RpcError raised."""
        return self._run(self._client.call(name, data, timeout=timeout, idempotent=idempotent,
                                           traceparent=traceparent))

    def call_all(self, name: str, data: Any = None, *, timeout: float | None = None,
                 max_replies: int | None = None, traceparent: str | None = None) -> list[Reply]:
        """``Client.call_all``, blocking: a ``Reply`` per provider."""
        return self._run(self._client.call_all(name, data, timeout=timeout,
                                               max_replies=max_replies,
                                               traceparent=traceparent))

    def rpcs(self) -> list[RpcInfo]:
        """``Client.rpcs``: what the cluster provides that this user may call."""
        return self._run(self._client.rpcs())

    def providers(self, name: str) -> list[ProviderInfo]:
        """``Client.providers``: the providers of ``name`` across the cluster."""
        return self._run(self._client.providers(name))

    def stream(self, name: str, data: Any = None, *, timeout: float | None = None,
               window: int = DEFAULT_WINDOW, traceparent: str | None = None) -> "SyncStream":
        """``Client.stream``, blocking: ``for part in client.stream(name, data)``."""
        return SyncStream(self, self._client.stream(name, data, timeout=timeout,
                                                    window=window, traceparent=traceparent))

    def provide(self, name: str, handler: Handler) -> None:
        """``Client.provide``; a plain function or a generator runs in a worker thread (it
        may block)."""
        self._run(self._client.provide(name, handler))

    def unprovide(self, name: str) -> None:
        self._run(self._client.unprovide(name))

    def ping(self) -> None:
        self._run(self._client.ping())

    def subscribe(self, topic: str, handler: EventHandler, *,
                  on_gap: GapHandler | None = None) -> None:
        """``Client.subscribe``; a plain function runs in the events thread (see above)."""
        if not inspect.iscoroutinefunction(handler):
            handler = self._in_events_thread(handler)
        self._run(self._client.subscribe(topic, handler, on_gap=on_gap))

    def unsubscribe(self, topic: str) -> None:
        """``Client.unsubscribe``: every handler of ``topic``."""
        self._run(self._client.unsubscribe(topic))

    def emit(self, topic: str, data: Any = None) -> None:
        self._run(self._client.emit(topic, data))

    def presence(self, users: Sequence[str] | None = None) -> Any:
        """``Client.presence``: every user online (a list), or ``users``' (a dict)."""
        return self._run(self._client.presence(users))

    def watch_presence(self, handler: PresenceHandler,
                       users: Sequence[str] | None = None) -> None:
        """``Client.watch_presence``; ``handler(user, online)`` runs in the events thread."""
        pool = self._events_pool()

        def run(user: str, online: bool) -> None:
            try:
                handler(user, online)
            except Exception:  # in its thread: said, as on the client's loop
                log.error("presence_handler_failed user=%s", user, exc_info=True)

        def queued(user: str, online: bool) -> None:
            pool.submit(run, user, online)
        self._run(self._client.watch_presence(queued, users))

    def unwatch_presence(self, users: Sequence[str] | None = None) -> None:
        self._run(self._client.unwatch_presence(users))

    def _events_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._events_thread is None:
            self._events_thread = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="rpcbus-sync-events")
        return self._events_thread

    def _in_events_thread(self, handler: EventHandler) -> EventHandler:
        pool = self._events_pool()

        def queued(data: Any) -> Any:
            return asyncio.wrap_future(pool.submit(handler, data))
        return queued

    def drain(self, timeout: float | None = None) -> None:
        """``Client.drain``: withdraw the names, let running handlers finish, close."""
        try:
            self._run(self._client.drain(timeout))
        finally:
            if self._client.closed:
                self._stop_loop()

    def close(self) -> None:
        """Close the client (``Client.close``) and end its thread. Idempotent."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()
            if self._events_thread is not None:
                self._events_thread.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a SyncClient method was called on its own loop (from an "
                               "async handler?): use await on .client there")
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("the client is closed")
        future = None
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            return future.result()
        except BaseException:
            # Ctrl-C (or any exception) in this thread: the coroutine stops too. (Ctrl-C
            # before ``future`` is set leaves the call running until close(), which
            # cancels the calls in flight.)
            if future is not None:
                future.cancel()
            raise

    def _stop_loop(self) -> None:
        if self._loop.is_closed() or threading.current_thread() is self._thread:
            return  # closed already, or misused from its own loop (``_run`` said so)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()  # worker threads still running a handler are not waited for


class SyncStream:
    """The parts of one stream, for blocking code: ``for part in client.stream(...)``.
    Each part blocks until it comes; the provider's error is raised after the parts
    before it. ``break`` (the stream is closed as it is dropped), ``close()``, leaving
    ``with`` or Ctrl-C while waiting tell the provider (CANCEL)."""

    def __init__(self, client: SyncClient, stream: Stream) -> None:
        self._client = client
        self._stream = stream

    def __iter__(self) -> "SyncStream":
        return self

    def __next__(self) -> Any:
        try:
            return self._client._run(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        loop = self._client._loop
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._stream.close)

    def __enter__(self) -> "SyncStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except RuntimeError:  # the loop closed between the check and the call
            pass


async def _open(urls: str | Sequence[str], options: Options) -> Client:
    client: Client = await connect(urls, **options)
    return client


def connect_sync(urls: str | Sequence[str], **options: Unpack[Options]) -> SyncClient:
    """Connect a blocking client to the first reachable node of ``urls``; the options are
    ``rpcbus.connect``'s. Use it with ``with``, or call ``close()``. Raises as
    ``connect`` does (``ConnectFailedError``, a node's AUTH_FAIL as an RpcError)."""
    return SyncClient(urls, **options)


__all__ = ["SyncClient", "SyncStream", "connect_sync"]
