"""The node's door: who a connecting client is, and the limits each user shares.

``Gate.login`` checks an AUTH's credentials and calls back with the ``User`` (or
None). Tokens are checked at once; passwords with scrypt in a small thread pool
(never on the event loop), at most ``MAX_LOGINS_AT_ONCE`` at a time (more are
refused: a flood of logins must not queue unbounded work). A password that
verified is remembered for ``LOGIN_CACHE_TTL`` seconds as a SHA-256 of
(user, password, stored hash), so a reconnect storm costs one scrypt per user.

Per user the gate keeps the count of open connections and one
``WindowLimiter`` shared by all of them; with auth mode ``none`` every
connection is its own anonymous user.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import structlog
from cachetools import TTLCache

from .auth import User, Users, verify_password
from .config import Config
from .limits import WindowLimiter

log = structlog.get_logger(module="rpcbus.auth")

MAX_LOGINS_AT_ONCE = 32
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
        self.stats: Counter[str] = Counter()

    def login(self, params: dict[str, Any], done: Callable[[User | None, str], None]) -> None:
        """Check AUTH ``params``; ``done(user, reason)`` runs later on the loop (user None:
        refused, ``reason`` says why, for the log only: the client is told less)."""
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
        if self.logins_running >= MAX_LOGINS_AT_ONCE:
            self.stats["logins_refused_busy"] += 1
            loop.call_soon(done, None, "too many logins in progress")
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="rpcbus-auth")
        self.logins_running += 1
        future = loop.run_in_executor(self._pool, verify_password, stored, password)

        def checked(f: asyncio.Future[bool]) -> None:
            self.logins_running -= 1
            ok = not f.cancelled() and f.exception() is None and f.result()
            if ok:
                self._verified[key] = True
            done(user if ok else None, "" if ok else "wrong user or password")

        future.add_done_callback(checked)

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

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
