"""The node's door: who a connecting client is, and the limits each user shares.

``opened`` counts each TCP connection by source address as it opens and says
when to refuse it (HTTP 429 over the per-address limits, 503 over the node's):
open connections (``limits.max_connections``, by default the open-file limit
less 256, so file descriptors are never exhausted) and connections not logged
in yet, whose handshakes and logins are in progress.

``Gate.login`` checks an AUTH's credentials and calls back with the ``User`` (or
None). A static token is checked at once by its digest; a JWT with the node's public
keys (broker/tokens.py; 0.1-0.25 ms) in a thread of its own, off the loop; a verified
one is remembered by its digest like a password, a refused one for ``REFUSAL_MEMORY``.

What failing logins may cost is bounded: the CPU their checks take (JWTs
verified, passwords hashed) is budgeted node-wide at ``FAILED_CHECKS_SHARE`` of a
core, half of it for one address (cluster/budget.py ``CheckBudget``). Past it, a
login from an address whose logins failed lately is answered ``BUSY`` unchecked,
whether its user exists or not, while logins from other addresses go on as
before. A password login whose user name has not failed from that address lately
is held by a budget of its own (``NEW_NAMES_SHARE``), so a flood repeating one
name does not hold the other users behind its address; one spraying new names
spends that budget too, and they wait (the SDKs send AUTH again with backoff)
until it pauses. Services should use tokens. A refusal, and a BUSY past the
budget, is answered ``REFUSAL_DELAY`` later per failure of its address lately (up
to ``MAX_REFUSAL_DELAY``), and counts as one more: a client retrying bad
credentials in a loop waits, and its connections cost the node little meanwhile,
from its first seconds on (were only checked failures counted, a flood held at
the budget would go on at full pace for as long as the budget takes to check a
few of its passwords).

Passwords with scrypt in a small
thread pool (never on the event loop), ``SCRYPT_THREADS`` at a time (one core
is always left to the loop). A password that verified is remembered for
``LOGIN_CACHE_TTL`` seconds as a SHA-256 of (user, password, stored hash), so a
reconnect storm costs one scrypt per user. The other logins wait in a bounded
queue, in this order:

- taken in turn by source address, first from the addresses whose checks failed
  least in the last ``FAILURE_MEMORY`` seconds: one address flooding logins
  waits behind its own checks, and a flood of wrong passwords behind every
  address that logs in right;
- an address whose passwords verified in the last ``GOOD_MEMORY`` seconds, and
  none failed, may use one thread more: its users do not wait for a check under
  way;
- the checks of addresses whose logins failed lately run in threads of their own
  (``SCRYPT_THREADS`` of them) at the lowest CPU priority (Linux: nice 19): a flood's
  checks take what the node's loop, its logged-in clients and the machine's other
  processes leave, and never hold a thread the other addresses' logins need;
- a waiting login of a failing address whose turn comes while its budget is
  spent is answered ``BUSY`` then, unchecked;
- at most ``MAX_QUEUED_LOGINS`` wait, ``MAX_QUEUED_PER_ADDRESS`` from one
  address. A full queue still takes a login from an address with fewer waiting
  than the busiest one, whose newest waiting login is answered ``BUSY`` to make
  room. Past that, and for a check that could not start before its deadline, the
  answer is ``BUSY`` (the client may AUTH again: the SDK does, with backoff).

Per user the gate keeps the count of open connections and one
``WindowLimiter`` shared by all of them; with auth mode ``none`` every
connection is its own anonymous user.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import resource
import sys
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import structlog
from cachetools import TTLCache

from rpcbus.broker.auth import BUSY, User, Users, verify_password
from rpcbus.broker.config import Config
from rpcbus.broker.limits import WindowLimiter
from rpcbus.broker.tokens import (
    Grant,
    TokenError,
    Tokens,
    expired,
    load_keys,
    looks_like_jwt,
    too_long,
)
from rpcbus.cluster.budget import CheckBudget

log = structlog.get_logger(module="rpcbus.auth")

SCRYPT_THREADS = max(1, min(2, (os.cpu_count() or 2) - 1))  # password checks at once
FAILURE_MEMORY = 60.0         # s a failed password check counts against its address
GOOD_MEMORY = 600.0           # s a verified password counts for its address
MAX_QUEUED_LOGINS = 256       # at ~50 ms a check, 6-13 s of work: about auth_timeout
MAX_QUEUED_PER_ADDRESS = 64
LOGIN_CACHE_TTL = 300.0
REFUSAL_MEMORY = 60.0         # s a refused JWT is remembered (by digest) as refused
FAILED_CHECKS_SHARE = 0.05    # of one core: what checks of failing logins may take, all
FAILED_CHECKS_BURST = 0.2     # addresses together (half for one), beyond this many s (a
                              # few typos: a password check takes ~30 ms here)
NEW_NAMES_SHARE = 0.05        # of one core: checks of names not failed from their address
REFUSAL_DELAY = 0.1           # s a refusal waits per failure of its address lately,
MAX_REFUSAL_DELAY = 1.0       # up to this
HOLD_AFTER = 5                # failures of an address lately before its connections wait
MAX_SECRET = 1024   # longest user name, password or token looked at


class Gate:
    def __init__(self, config: Config) -> None:
        self.mode = config.auth.mode
        self.users = Users(config.auth.users, config.auth.roles)
        self.tokens = _tokens(config)
        self.max_failures = config.auth.max_failures
        self._limits = config.limits
        self._pool: ThreadPoolExecutor | None = None      # password checks
        self._failing_pool: ThreadPoolExecutor | None = None  # of failing addresses
        self._jwt_pool: ThreadPoolExecutor | None = None  # JWT checks
        # a JWT's digest -> the logins (address, done) waiting for its check
        self._verifying: dict[bytes, list[tuple[str, Callable[[User | None, str], None]]]] = {}
        self._verified: TTLCache[bytes, bool] = TTLCache(4096, LOGIN_CACHE_TTL)
        self._granted: TTLCache[bytes, Grant] = TTLCache(4096, LOGIN_CACHE_TTL)  # JWTs
        self._refused: TTLCache[bytes, str] = TTLCache(4096, REFUSAL_MEMORY)  # JWTs
        self._failed: TTLCache[str, int] = TTLCache(4096, FAILURE_MEMORY)  # by address
        self.budget = CheckBudget(FAILED_CHECKS_SHARE, FAILED_CHECKS_BURST)
        self.new_names = CheckBudget(NEW_NAMES_SHARE, FAILED_CHECKS_BURST)  # _lane
        self._failed_users: TTLCache[tuple[str, str], bool] = TTLCache(4096, FAILURE_MEMORY)
        self._good: TTLCache[str, bool] = TTLCache(4096, GOOD_MEMORY)      # by address
        self._limiters: dict[str, WindowLimiter] = {}
        self.connections: Counter[str] = Counter()
        self.logins_running = 0          # password checks under way (``_checker``),
        self.failing_running = 0         # and those of addresses whose logins failed lately
        self.queued = 0
        self._queued: OrderedDict[str, deque[_Login]] = OrderedDict()  # by source address
        self.provided: Counter[str] = Counter()  # names provided now, per user
        self.stats: Counter[str] = Counter()
        self.open = 0                                  # TCP connections, all addresses
        self.by_address: Counter[str] = Counter()
        self.waiting = 0                               # of them not logged in yet
        self.waiting_by_address: Counter[str] = Counter()
        self.max_connections = self._limits.max_connections or _open_file_room()

    def reload(self, config: Config) -> None:
        """Users, roles and limits as ``config`` has them now (a reload): logins from
        now on check the new table; rate limits start afresh, with the new values (each
        session takes its limiter again: SessionRules.rights_changed)."""
        self.users = Users(config.auth.users, config.auth.roles)
        self.tokens = _tokens(config)
        self._granted.clear()
        self._refused.clear()
        self.max_failures = config.auth.max_failures
        self._limits = config.limits
        self._limiters.clear()
        self.max_connections = self._limits.max_connections or _open_file_room()

    # -- connections -------------------------------------------------------------------

    def opened(self, address: str) -> tuple[int, str] | None:
        """A TCP connection from ``address``, counted at once; None to take it, else the
        HTTP status and text to refuse it with (``closed(address, False)`` follows)."""
        limits = self._limits
        self.open += 1
        self.waiting += 1
        here = self.by_address[address] = self.by_address[address] + 1
        waiting_here = self.waiting_by_address[address] = self.waiting_by_address[address] + 1
        if self.open > self.max_connections:
            refusal = 503, f"full: this node has its {self.max_connections} connections"
        elif limits.max_connections_per_address and here > limits.max_connections_per_address:
            refusal = 429, (f"too many connections from {address}: "
                            f"{limits.max_connections_per_address} at most")
        elif limits.max_unauthenticated and self.waiting > limits.max_unauthenticated:
            refusal = 503, "busy: too many connections logging in; retry"
        elif (limits.max_unauthenticated_per_address
              and waiting_here > limits.max_unauthenticated_per_address):
            refusal = 429, (f"too many connections logging in from {address}: "
                            f"{limits.max_unauthenticated_per_address} at most")
        else:
            return None
        self.stats[f"connections_refused_{refusal[0]}"] += 1
        return refusal

    def logged_in(self, address: str) -> None:
        """A connection from ``address`` completed AUTH."""
        self.waiting -= 1
        _decrement(self.waiting_by_address, address)

    def closed(self, address: str, logged_in: bool) -> None:
        """A connection counted by ``opened`` closed."""
        self.open -= 1
        _decrement(self.by_address, address)
        if not logged_in:
            self.logged_in(address)

    # -- logins ------------------------------------------------------------------------

    def login(self, params: dict[str, Any], done: Callable[[User | None, str], None],
              address: str = "", wanted: Callable[[], bool] = lambda: True) -> None:
        """Check AUTH ``params`` from ``address``; ``done(user, reason)`` runs later on the
        loop (user None: refused, ``reason`` says why, for the log only: the client is
        told less; ``BUSY``: not checked, try again). ``wanted()`` False: the client left,
        skip the check."""
        token, name, password = params.get("token"), params.get("user"), params.get("password")
        if isinstance(token, str) and looks_like_jwt(token):
            self._token_login(token, address, done)
            return
        if any(isinstance(v, str) and len(v) > MAX_SECRET for v in (token, name, password)):
            self._refuse(address, "credentials too long", done)
            return
        if isinstance(token, str):
            user = self.users.by_token_value(token)
            if user is None:
                self._refuse(address, "unknown token", done)
            else:
                asyncio.get_running_loop().call_soon(done, user, "")
            return
        loop = asyncio.get_running_loop()
        if not (isinstance(name, str) and isinstance(password, str)):
            self._refuse(address, "AUTH needs a token, or a user and a password", done)
            return
        user = self.users.by_name.get(name)
        stored = user.password_hash if user is not None else None
        key = hashlib.sha256(f"{name}\0{password}\0{stored}".encode()).digest()
        if stored is not None and key in self._verified:
            loop.call_soon(done, user, "")
            return
        budget = self._lane(address, name)
        if budget is not None and not budget.allows(address, loop.time()):
            self._over_budget(address, done)
            return
        queue = self._queued.get(address)
        if (queue is not None and len(queue) >= MAX_QUEUED_PER_ADDRESS) or (
                self.queued >= MAX_QUEUED_LOGINS and not self._make_room(len(queue or ()))):
            self.stats["logins_busy"] += 1
            loop.call_soon(done, None, BUSY)
            return
        if queue is None:
            queue = self._queued[address] = deque()
        queue.append(_Login(name, user, stored, password, key, done, wanted,
                            loop.time() + self._limits.auth_timeout))
        self.queued += 1
        self._start_checks()

    def _token_login(self, token: str, address: str,
                     done: Callable[[User | None, str], None]) -> None:
        """A JWT login: a token verified lately is remembered by its digest (until a
        reload or ``LOGIN_CACHE_TTL``), one refused lately too (``REFUSAL_MEMORY``), so a
        reconnect storm or a replayed bad token costs a lookup; the rest is verified in a
        thread of its own (~0.1-0.25 ms, benchmarks/token_cost.py; the signature checks
        leave the GIL), one check per token however many logins present it at once,
        unless ``address`` failed lately and the failing checks' CPU budget is spent:
        then BUSY, unchecked. Their number is bounded by the connections not logged in
        (``limits.max_unauthenticated``): each sends one AUTH at a time."""
        loop = asyncio.get_running_loop()
        unread = too_long(token)
        if unread is not None:  # refused unread, not remembered
            self._refuse(address, str(unread), done)
            return
        key = hashlib.sha256(token.encode()).digest()
        grant = self._granted.get(key)
        if grant is not None:
            if time.time() > grant.expires:
                self._refuse(address, str(expired(grant.expires - self.tokens.leeway)), done)
            else:
                self.stats["token_logins"] += 1
                loop.call_soon(done, self.users.granted(grant), "")
            return
        refusal = self._refused.get(key)
        if refusal is not None:
            self.stats["token_refusals_remembered"] += 1
            self._refuse(address, refusal, done)
            return
        budget = self._lane(address)
        if budget is not None and not budget.allows(address, loop.time()):
            self._over_budget(address, done)
            return
        waiting = self._verifying.get(key)
        if waiting is not None:  # the same token is being verified: its answer serves both
            waiting.append((address, done))
            return
        self._verifying[key] = [(address, done)]
        if self._jwt_pool is None:
            self._jwt_pool = ThreadPoolExecutor(1, thread_name_prefix="rpcbus-jwt")
        tokens = self.tokens
        future = loop.run_in_executor(self._jwt_pool, _timed_verify, tokens, token)
        future.add_done_callback(functools.partial(self._token_checked, token, key, tokens))

    def _token_checked(self, token: str, key: bytes, tokens: Tokens,
                       f: asyncio.Future[tuple[Grant | TokenError, float]]) -> None:
        """A JWT's check ended (on the loop): every login that waited for it is answered.
        A reload meanwhile: each is judged again under the new keys. Cancelled (the gate
        closed): nobody is answered, their connections are closing."""
        waiters = self._verifying.pop(key, [])
        if f.cancelled():
            return
        if self.tokens is not tokens:
            for address, done in waiters:
                self._token_login(token, address, done)
            return
        failure = f.exception()
        if failure is not None:  # a bug in a check: refused, said once in the log
            log.error("token_check_failed", error=repr(failure))
            result: Grant | TokenError = TokenError("token could not be checked", False)
            seconds = 0.0
        else:
            result, seconds = f.result()
        if isinstance(result, TokenError):
            self.stats["token_checks_failed"] += 1
            self.budget.spend(waiters[0][0], seconds, asyncio.get_running_loop().time())
            if result.lasting:
                self._refused[key] = str(result)
            for address, done in waiters:
                self._refuse(address, str(result), done)
            return
        self._granted[key] = result
        for _, done in waiters:
            self.stats["token_logins"] += 1
            done(self.users.granted(result), "")

    def _refuse(self, address: str, reason: str,
                done: Callable[[User | None, str], None]) -> None:
        """A login refused without a password check: counted against ``address``, and
        answered the later the more its logins failed lately (``REFUSAL_DELAY`` each, up
        to ``MAX_REFUSAL_DELAY``): a client retrying bad credentials in a loop waits, a
        typo does not."""
        failed = self._failed_once_more(address)
        self.stats["login_refusals"] += 1
        _answer_later(failed, done, reason)

    def _lane(self, address: str, name: str | None = None) -> CheckBudget | None:
        """The budget a check for user ``name`` from ``address`` is held by: none while
        the address's logins have not failed lately; ``budget`` when this name's did (a
        flood repeating itself), or for a JWT (``name`` None: its user is known only once
        it verified); else ``new_names``, so the users behind a flooding address are not
        held by the flood's own checks. Known and unknown names are judged alike."""
        if address not in self._failed:
            return None
        if name is None or (address, name) in self._failed_users:
            return self.budget
        return self.new_names

    def _over_budget(self, address: str, done: Callable[[User | None, str], None]) -> None:
        """A login from ``address``, whose logins failed lately, while the failing checks'
        budget is spent: answered BUSY unchecked, as late as a refusal would be, and
        counted as a failure of the address (a client retrying in a loop waits the longer,
        and its new connections are held: ``hold_for``)."""
        self.stats["logins_busy"] += 1
        self.stats["logins_over_budget"] += 1
        _answer_later(self._failed_once_more(address), done, BUSY)

    def abused(self, address: str) -> None:
        """A connection from ``address`` was closed for a flood before it logged in
        (broker/session.py ``close_for_flood``): the address counts as failing, as for a
        failed login (its logins are held by the budget, its connections by
        ``hold_for``)."""
        self.stats["floods_closed"] += 1
        self._failed_once_more(address)

    def hold_for(self, address: str) -> float:
        """How long a new connection from ``address`` waits before it is read:
        ``REFUSAL_DELAY`` per failed login or flood of the address lately beyond
        ``HOLD_AFTER`` (a few typos hold nobody), up to ``MAX_REFUSAL_DELAY``. A client
        that reconnects in a loop after each refusal or close so waits, and holds its
        connections (counted by ``limits.max_unauthenticated_per_address``) instead of
        making the node take handshakes as fast as it can send them; clients behind
        the same address wait as long."""
        failed = self._failed.get(address, 0) - HOLD_AFTER
        return min(failed * REFUSAL_DELAY, MAX_REFUSAL_DELAY) if failed > 0 else 0.0

    def _failed_once_more(self, address: str) -> int:
        """A login from ``address`` failed: its count of the last ``FAILURE_MEMORY`` s goes
        up by one; returns the count before."""
        failed = self._failed.get(address, 0)
        self._failed[address] = failed + 1
        return failed

    def _make_room(self, mine: int) -> bool:
        """The queue is full: answer BUSY to the newest login of the address with the most
        waiting, when that is more than ``mine`` (the new login's address has waiting);
        False when no address has more."""
        address, queue = max(self._queued.items(), key=lambda item: len(item[1]))
        if len(queue) <= mine:
            return False
        login = queue.pop()
        self.queued -= 1
        if not queue:
            del self._queued[address]
        self.stats["logins_busy"] += 1
        self.stats["logins_made_room"] += 1
        asyncio.get_running_loop().call_soon(login.done, None, BUSY)
        return True

    def _start_checks(self) -> None:
        """Start queued password checks while threads are free, one address at a time. An
        address whose logins verified lately and failed not at all may use one thread more:
        its users do not wait for a check of somebody else's that is under way. Checks of
        addresses whose logins failed lately have threads of their own (``_checker``):
        however slowly those run, the others' do not wait for them."""
        loop = asyncio.get_running_loop()
        while self._queued:
            address = self._next_address()
            failing = address in self._failed
            if failing:
                if self.failing_running >= SCRYPT_THREADS:
                    break
            elif self.logins_running >= SCRYPT_THREADS + (address in self._good):
                break
            queue = self._queued[address]
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
            login.budget = self._lane(address, login.name)
            if login.budget is not None and not login.budget.allows(address, loop.time()):
                self._over_budget(address, login.done)
                continue
            login.failing = failing
            if failing:
                self.failing_running += 1
            else:
                self.logins_running += 1
            login.started = loop.time()
            future = loop.run_in_executor(self._checker(failing), verify_password,
                                          login.stored, login.password)
            future.add_done_callback(functools.partial(self._checked, login, address))

    def _checker(self, failing: bool) -> ThreadPoolExecutor:
        """The threads a password check runs in: for an address whose logins failed
        lately (``failing_running`` of them at once), threads at the lowest CPU priority
        (``_yielding``), so the checks a flood makes take only what the node's loop, its
        logged-in clients' calls and the machine's other processes leave; for the
        others, threads at the node's own."""
        pool = self._failing_pool if failing else self._pool
        if pool is None:
            pool = ThreadPoolExecutor(SCRYPT_THREADS + (not failing),
                                      thread_name_prefix="rpcbus-auth",
                                      initializer=_yielding if failing else None)
            if failing:
                self._failing_pool = pool
            else:
                self._pool = pool
        return pool

    def _next_address(self) -> str:
        """The address whose turn it is: the first, in turn order, of those with the
        fewest recently failed checks."""
        best, fewest = "", -1
        for address in self._queued:
            failed = self._failed.get(address, 0)
            if fewest < 0 or failed < fewest:
                best, fewest = address, failed
                if not failed:
                    break
        return best

    def _checked(self, login: "_Login", address: str, f: asyncio.Future[bool]) -> None:
        if login.failing:
            self.failing_running -= 1
        else:
            self.logins_running -= 1
        ok = not f.cancelled() and f.exception() is None and f.result()
        if ok:
            self._verified[login.key] = True
            self._good[address] = True
        else:
            self._failed_once_more(address)
            self._failed_users[(address, login.name)] = True
            now = asyncio.get_running_loop().time()
            (login.budget or self.budget).spend(address, now - login.started, now)
        login.done(login.user if ok else None, "" if ok else "wrong user or password")
        self._start_checks()

    def now_for(self, user: User, login_token: str | None) -> User | None:
        """``user`` as this configuration has it now (after a reload): None when it is
        gone, or the token it logged in with (``login_token``, its digest) no longer
        stands: a static token removed, a JWT's key removed or its issuer or audience
        changed. Never a different user."""
        if user.grant is not None:
            if self.tokens.holds(user.grant):
                return None
            granted = self.users.granted(user.grant)  # a token_sub added or removed: gone
            return granted if granted.key == user.key else None
        new = (self.users.by_token.get(login_token) if login_token is not None
               else self.users.by_name.get(user.name))
        return new if new is not None and new.name == user.name else None

    @staticmethod
    def seconds_left(user: User) -> float | None:
        """Seconds until ``user``'s token expires by this host's wall clock (None: it has
        no expiry). The shell's reading: a session's rules get it with the login's answer."""
        return None if user.grant is None else user.grant.expires - time.time()

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
        limiter = self._limiters.get(user.key)
        if limiter is None:
            limiter = self._limiters[user.key] = WindowLimiter(limits.rate_window,
                                                                messages, nbytes)
        return limiter

    def max_provided(self, user: User | None) -> int:
        """Names ``user``'s connections may provide at once on this node (0: no limit)."""
        if user is not None and user.max_provided is not None:
            return user.max_provided
        return self._limits.max_provided_per_user

    def close(self) -> None:
        for pool in (self._pool, self._failing_pool, self._jwt_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


def _answer_later(failed: int, done: Callable[[User | None, str], None],
                  reason: str) -> None:
    """``done(None, reason)`` ``REFUSAL_DELAY`` later per login of its address that
    failed lately (``failed``), up to ``MAX_REFUSAL_DELAY``; at once for none."""
    delay = min(failed * REFUSAL_DELAY, MAX_REFUSAL_DELAY)
    loop = asyncio.get_running_loop()
    if delay:
        loop.call_later(delay, done, None, reason)
    else:
        loop.call_soon(done, None, reason)


def _timed_verify(tokens: Tokens, token: str) -> tuple[Grant | TokenError, float]:
    """In the JWT thread: the grant of ``token`` or the refusal, and the CPU it took."""
    started = time.thread_time()
    try:
        result: Grant | TokenError = tokens.verify(token)
    except TokenError as exc:
        result = exc
    return result, time.thread_time() - started


def _tokens(config: Config) -> Tokens:
    auth = config.auth
    return Tokens(load_keys(auth.token_keys), auth.token_issuer, auth.token_audience,
                  auth.token_leeway, auth.token_max_ttl)


def _decrement(counter: Counter[str], key: str) -> None:
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1


def _open_file_room() -> int:
    """Connections this process can hold: its open-file limit less 256 (Redis links,
    history files, the listening sockets)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(soft - 256, 16) if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass(slots=True)
class _Login:
    """A password check waiting for a thread."""

    name: str
    user: User | None
    stored: str | None
    password: str
    key: bytes
    done: Callable[[User | None, str], None]
    wanted: Callable[[], bool]
    deadline: float
    started: float = 0.0
    budget: CheckBudget | None = None  # the lane it was checked in (Gate._lane)
    failing: bool = False              # its address's logins failed lately (Gate._checker)


def _yielding() -> None:
    """This thread runs at the lowest CPU priority (Linux: nice 19, this thread alone).
    Elsewhere it keeps the process's (``setpriority`` there is per process)."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # not allowed here: the checks run at the process's priority
            pass
