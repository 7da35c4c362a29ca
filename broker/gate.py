"""The node's door: who a connecting client is, and the limits each user shares.

``Gate.login`` checks an AUTH's credentials and calls back with the ``User`` (or
None). Tokens are checked at once; passwords with scrypt in a small thread pool
(never on the event loop), ``SCRYPT_THREADS`` at a time. The others wait in a
bounded queue, taken in turn by source address (one address flooding logins
waits behind its own checks, not in front of everyone else's): at most
``MAX_QUEUED_LOGINS`` waiting, ``MAX_QUEUED_PER_ADDRESS`` from one address; past
that, and for a check that could not start before its deadline, the answer is
``BUSY`` (the client may AUTH again: the SDK does, with backoff). A password that
verified is remembered for ``LOGIN_CACHE_TTL`` seconds as a SHA-256 of
(user, password, stored hash), so a reconnect storm costs one scrypt per user.

Per user the gate keeps the count of open connections and one
``WindowLimiter`` shared by all of them; with auth mode ``none`` every
connection is its own anonymous user.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import structlog
from cachetools import TTLCache

from rpcbus.broker.auth import User, Users, verify_password
from rpcbus.broker.config import Config
from rpcbus.broker.limits import WindowLimiter

log = structlog.get_logger(module="rpcbus.auth")

SCRYPT_THREADS = 2            # password checks running at once
MAX_QUEUED_LOGINS = 256       # ~6 s of scrypt work on two threads: within auth_timeout
MAX_QUEUED_PER_ADDRESS = 64
BUSY = "busy"                 # the reason ``login`` gives when it cannot check now
LOGIN_CACHE_TTL = 300.0
MAX_SECRET = 1024   # longest user name, password or token looked at


class Gate:
    def __init__(self, config: Config) -> None:
        self.mode = config.auth.mode
        self.users = Users(config.auth.users, config.auth.roles)
        self.max_failures = config.auth.max_failures
        self._limits = config.limits
        self._pool: ThreadPoolExecutor | None = None
        self._verified: TTLCache[bytes, bool] = TTLCache(4096, LOGIN_CACHE_TTL)
        self._limiters: dict[str, WindowLimiter] = {}
        self.connections: Counter[str] = Counter()
        self.logins_running = 0
        self.queued = 0
        self._queued: OrderedDict[str, deque[_Login]] = OrderedDict()  # by source address
        self.provided: Counter[str] = Counter()  # names provided now, per user
        self.stats: Counter[str] = Counter()

    def login(self, params: dict[str, Any], done: Callable[[User | None, str], None],
              address: str = "", wanted: Callable[[], bool] = lambda: True) -> None:
        """Check AUTH ``params`` from ``address``; ``done(user, reason)`` runs later on the
        loop (user None: refused, ``reason`` says why, for the log only: the client is
        told less; ``BUSY``: not checked, try again). ``wanted()`` False: the client left,
        skip the check."""
        token, name, password = params.get("token"), params.get("user"), params.get("password")
        loop = asyncio.get_running_loop()
        if any(isinstance(v, str) and len(v) > MAX_SECRET for v in (token, name, password)):
            loop.call_soon(done, None, "credentials too long")
            return
        if isinstance(token, str):
            user = self.users.by_token_value(token)
            loop.call_soon(done, user, "" if user else "unknown token")
            return
        if not (isinstance(name, str) and isinstance(password, str)):
            loop.call_soon(done, None, "AUTH needs a token, or a user and a password")
            return
        user = self.users.by_name.get(name)
        stored = user.password_hash if user is not None else None
        key = hashlib.sha256(f"{name}\0{password}\0{stored}".encode()).digest()
        if stored is not None and key in self._verified:
            loop.call_soon(done, user, "")
            return
        queue = self._queued.get(address)
        if self.queued >= MAX_QUEUED_LOGINS or (
                queue is not None and len(queue) >= MAX_QUEUED_PER_ADDRESS):
            self.stats["logins_busy"] += 1
            loop.call_soon(done, None, BUSY)
            return
        if queue is None:
            queue = self._queued[address] = deque()
        queue.append(_Login(user, stored, password, key, done, wanted,
                            loop.time() + self._limits.auth_timeout))
        self.queued += 1
        self._start_checks()

    def _start_checks(self) -> None:
        """Start queued password checks while threads are free, one address at a time."""
        loop = asyncio.get_running_loop()
        while self.logins_running < SCRYPT_THREADS and self._queued:
            address, queue = next(iter(self._queued.items()))
            login = queue.popleft()
            self.queued -= 1
            if queue:
                self._queued.move_to_end(address)  # the next address's turn
            else:
                del self._queued[address]
            if not login.wanted():  # the connection closed while it waited
                continue
            if loop.time() > login.deadline:
                self.stats["logins_busy"] += 1
                login.done(None, BUSY)
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(SCRYPT_THREADS, thread_name_prefix="rpcbus-auth")
            self.logins_running += 1
            future = loop.run_in_executor(self._pool, verify_password, login.stored,
                                          login.password)
            future.add_done_callback(functools.partial(self._checked, login))

    def _checked(self, login: "_Login", f: asyncio.Future[bool]) -> None:
        self.logins_running -= 1
        ok = not f.cancelled() and f.exception() is None and f.result()
        if ok:
            self._verified[login.key] = True
        login.done(login.user if ok else None, "" if ok else "wrong user or password")
        self._start_checks()

    def limiter_for(self, user: User | None) -> WindowLimiter | None:
        """The limiter shared by ``user``'s connections (a new one per anonymous
        connection); None when no limit applies."""
        limits = self._limits
        messages = limits.rate_messages if user is None or user.rate_messages is None \
            else user.rate_messages
        nbytes = limits.rate_bytes if user is None or user.rate_bytes is None \
            else user.rate_bytes
        if not messages and not nbytes:
            return None
        if user is None:
            return WindowLimiter(limits.rate_window, messages, nbytes)
        limiter = self._limiters.get(user.name)
        if limiter is None:
            limiter = self._limiters[user.name] = WindowLimiter(limits.rate_window,
                                                                messages, nbytes)
        return limiter

    def max_provided(self, user: User | None) -> int:
        """Names ``user``'s connections may provide at once on this node (0: no limit)."""
        if user is not None and user.max_provided is not None:
            return user.max_provided
        return self._limits.max_provided_per_user

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(slots=True)
class _Login:
    """A password check waiting for a thread."""

    user: User | None
    stored: str | None
    password: str
    key: bytes
    done: Callable[[User | None, str], None]
    wanted: Callable[[], bool]
    deadline: float
