"""The client's event subscriptions (topics, their handlers, the gaps it is told of) and
its presence watchers.

``Subscriptions`` keeps, per topic, the handlers ``Client.subscribe`` added (in
that order) and hands each EVENT to them on the client's event loop. A handler
is ``handler(data)``: a plain function runs inline (keep it short: the
connection is not read meanwhile); a coroutine function's coroutine runs as a
Task (kept until it ends; cancelled by ``close``). An exception in either is
logged (``rpcbus.events``) and counted in ``handler_errors``, never raised into
the client.

Losses are told, never hidden: a GAP from the node (the client read too slowly,
and the node dropped ``count`` events of a topic; or ``count`` None: its node lost
the cluster bus) and a lost connection (events emitted until the subscriptions
are made again on the next connection are lost) call each ``on_gap(topic,
count)`` of the topics concerned, and add to ``lost`` (known counts only).

An event comes once, in order, also across moves: each EVENT from a node that
stamps them carries its origin (the process of the node its publisher was on)
and a number counting up there, and ``Seen`` drops one no newer than the last of
its topic and origin (a subscriber that moved from the origin node to another
would otherwise get again, off the cluster bus, what the origin gave it first).
Dropped repeats are counted in ``repeats``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any, Awaitable, Callable, Union

log = logging.getLogger("rpcbus.events")

EventHandler = Callable[[Any], Union[None, Awaitable[None]]]
GapHandler = Callable[[str, Union[int, None]], None]
PresenceHandler = Callable[[str, bool], None]


class Seen:
    """The newest event number had of each topic and origin: ``fresh`` says whether an
    event is new here (and remembers it), ``forget`` drops a topic's. Pure.

    An origin's events of one topic reach any node in the order it numbered them (one
    node hands them on in the order read; one Redis channel carries a topic's), so an
    event no newer than the last one had of its topic and origin was had already. At
    most ``MAX_ORIGINS`` origins are kept per topic (nodes restart under new
    origins): the longest unheard goes first."""

    MAX_ORIGINS = 64

    def __init__(self) -> None:
        self._last: dict[str, dict[int, int]] = {}   # topic -> origin -> newest number
        self.repeats = 0

    def fresh(self, topic: str, origin: int, seq: int) -> bool:
        last = self._last.get(topic)
        if last is None:
            last = self._last[topic] = {}
        had = last.pop(origin, None)
        if had is not None and seq <= had:
            last[origin] = had
            self.repeats += 1
            return False
        if had is None and len(last) >= self.MAX_ORIGINS:
            del last[next(iter(last))]
        last[origin] = seq   # last in the dict: the most recently heard
        return True

    def forget(self, topic: str) -> None:
        self._last.pop(topic, None)


class Subscriptions:
    """See the module docstring."""

    def __init__(self) -> None:
        self.handlers: dict[str, list[tuple[EventHandler, GapHandler | None]]] = {}
        self.lost = 0            # events the node said it dropped for this client
        self.gaps = 0            # gap notices, of known count or not
        self.handler_errors = 0
        self.seen = Seen()
        self._tasks: set[asyncio.Future[Any]] = set()

    @property
    def repeats(self) -> int:
        """Events dropped as had already (see ``Seen``)."""
        return self.seen.repeats

    @property
    def topics(self) -> list[str]:
        return list(self.handlers)

    def add(self, topic: str, handler: EventHandler, on_gap: GapHandler | None) -> bool:
        """True when ``topic`` is new here (the node must be told)."""
        entries = self.handlers.get(topic)
        if entries is None:
            self.handlers[topic] = [(handler, on_gap)]
            return True
        entries.append((handler, on_gap))
        return False

    def remove(self, topic: str, handler: EventHandler | None = None) -> bool:
        """Take ``handler`` (every handler: None) off ``topic``; True when the topic has
        none left (the node must be told)."""
        entries = self.handlers.get(topic)
        if entries is None:
            return False
        if handler is not None:
            entries[:] = [e for e in entries if e[0] != handler]
        if handler is None or not entries:
            del self.handlers[topic]
            self.seen.forget(topic)
            return True
        return False

    def deliver(self, topic: str, data: Any, origin: int | None = None,
                seq: int | None = None) -> None:
        """An EVENT: to each handler of ``topic`` (none: it came after an unsubscribe),
        unless it was had already (``origin`` and ``seq``: see ``Seen``)."""
        if origin is not None and seq is not None and not self.seen.fresh(topic, origin, seq):
            return
        for handler, _ in self.handlers.get(topic, ()):
            try:
                result = handler(data)
            except Exception:
                self._failed(topic)
                continue
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self._tasks.add(task)
                task.add_done_callback(self._ended(topic))

    def gap(self, topic: str | None, count: int | None) -> None:
        """The node dropped ``count`` events of ``topic`` (None, None: any of them may be
        lost), or the connection was lost (the client's own, the same)."""
        self.gaps += 1
        if count is not None:
            self.lost += count
        log.warning("events_lost topic=%s count=%s", topic if topic is not None else "*",
                    count if count is not None else "unknown")
        topics = [topic] if topic is not None else list(self.handlers)
        for each in topics:
            for _, on_gap in self.handlers.get(each, ()):
                if on_gap is None:
                    continue
                try:
                    on_gap(each, count)
                except Exception:
                    self._failed(each)

    def close(self) -> None:
        """Cancel the handlers still running."""
        for task in list(self._tasks):
            task.cancel()

    def _ended(self, topic: str) -> Callable[[asyncio.Future[Any]], None]:
        def done(task: asyncio.Future[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self._failed(topic, task.exception())
        return done

    def _failed(self, topic: str, exc: BaseException | None = None) -> None:
        self.handler_errors += 1
        log.error("event_handler_failed topic=%s", topic, exc_info=exc or True)


class Watchers:
    """``Client.watch_presence``'s handlers, each of every user (None) or of some; a
    PRESENCE notice goes to each handler it concerns, inline on the client's loop (an
    exception is logged, ``rpcbus.events``)."""

    def __init__(self) -> None:
        self.handlers: list[tuple[PresenceHandler, frozenset[str] | None]] = []

    def add(self, handler: PresenceHandler,
            users: list[str] | None) -> tuple[PresenceHandler, frozenset[str] | None]:
        """Add a handler; returns its entry (``drop`` takes it back)."""
        entry = (handler, None if users is None else frozenset(users))
        self.handlers.append(entry)
        return entry

    def drop(self, entry: tuple[PresenceHandler, frozenset[str] | None]) -> None:
        self.handlers = [e for e in self.handlers if e is not entry]

    def remove(self, users: list[str] | None) -> None:
        """Every handler (None), or ``users`` out of each handler's."""
        if users is None:
            self.handlers = []
            return
        gone = frozenset(users)
        self.handlers = [(h, of if of is None else of - gone) for h, of in self.handlers
                         if of is None or of - gone]

    def asked(self) -> list[list[str] | None]:
        """What the node must be told after a reconnect: None (everyone) and/or users."""
        users = sorted({u for _, of in self.handlers if of is not None for u in of})
        return ([None] if any(of is None for _, of in self.handlers) else []) + (
            [users] if users else [])

    def changed(self, user: str, online: bool) -> None:
        for handler, of in list(self.handlers):
            if of is None or user in of:
                try:
                    handler(user, online)
                except Exception:
                    log.error("presence_handler_failed user=%s", user, exc_info=True)
