"""Who may connect, provide, call, publish and subscribe: password and token checks,
glob permissions.

Pure (no I/O, no event loop): the session calls these and runs the slow part,
``verify_password``, in a worker thread.

Passwords are stored as scrypt hashes (``rpcbus hash-password``): the text
``scrypt$N$r$p$salt$hash`` (salt and hash in unpadded URL-safe base64).
Static tokens are stored as their SHA-256 (``rpcbus new-token`` prints a token
and its digest): a token is random and long, so a fast hash is enough and a
config file that leaks gives no token away.

Permissions are glob patterns (``fnmatch``, case-sensitive: ``*`` matches any
run of characters, dots included) in lists, ``call`` and ``provide`` for RPC
names, ``publish`` and ``subscribe`` for event topics, ``presence`` for the users
whose presence one may see (docs/events.md), on a user and on the roles the user
has. A name is allowed when any pattern matches
it; no matching pattern means denied.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from rpcbus.broker.tokens import Grant

SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1   # ~50 ms on one core here: OWASP's floor
_DUMMY_HASH: str | None = None                # verified against for unknown users

#: the reason broker/gate.py gives for a login it could not check now (try again)
BUSY = "busy"


class AuthConfigError(ValueError):
    """A user or role in the config that cannot be used; the text names it."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """A new scrypt hash of ``password`` with a random salt, as stored in the config."""
    salt = os.urandom(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p,
                            maxmem=256 * n * r + (1 << 20), dklen=32)
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("not an scrypt hash made by `rpcbus hash-password`")
    n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
    if n < 2 or n & (n - 1) or not 0 < r <= 64 or not 0 < p <= 16 or n > 1 << 20:
        raise ValueError("scrypt parameters out of range")
    return n, r, p, _unb64(parts[4]), _unb64(parts[5])


def verify_password(stored: str | None, password: str) -> bool:
    """True when ``password`` matches ``stored``; constant time in the digest compare.

    ``stored=None`` (an unknown user, or one with no password) spends the same
    time on a dummy hash and returns False, so timing does not tell which
    user names exist. Slow on purpose (~50 ms): call it off the event loop.
    """
    global _DUMMY_HASH
    if stored is None:
        if _DUMMY_HASH is None:
            _DUMMY_HASH = hash_password(secrets.token_hex(16))
        verify_password(_DUMMY_HASH, password)
        return False
    n, r, p, salt, expected = _parse_hash(stored)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p,
                            maxmem=256 * n * r + (1 << 20), dklen=len(expected))
    return hmac.compare_digest(digest, expected)


def token_digest(token: str) -> str:
    """The SHA-256 (hex) of a token, as stored in the config."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Permissions:
    """The ``call``, ``provide``, ``publish``, ``subscribe`` and ``presence`` globs of one
    user, with the names they allow cached (a denied name is matched again each time: junk
    must not fill or churn the cache). Callers check a name's shape and length first."""

    __slots__ = ("call", "provide", "publish", "subscribe", "presence", "_calls",
                 "_provides", "_publishes", "_subscribes", "_sees")
    CACHE = 4096   # names remembered per user and list; more and the cache starts over

    def __init__(self, call: tuple[str, ...], provide: tuple[str, ...],
                 publish: tuple[str, ...] = (), subscribe: tuple[str, ...] = (),
                 presence: tuple[str, ...] = ()) -> None:
        self.call, self.provide = call, provide
        self.publish, self.subscribe = publish, subscribe
        self.presence = presence
        self._sees: dict[str, bool] = {}
        self._calls: dict[str, bool] = {}
        self._provides: dict[str, bool] = {}
        self._publishes: dict[str, bool] = {}
        self._subscribes: dict[str, bool] = {}

    def may_call(self, name: str) -> bool:
        allowed = self._calls.get(name)
        if allowed is None:
            allowed = self._decide(self._calls, self.call, name)
        return allowed

    def allowed_call(self, name: str) -> bool:
        """True when ``name`` is known to be callable (cached): no checks needed."""
        return name in self._calls

    def may_provide(self, name: str) -> bool:
        allowed = self._provides.get(name)
        if allowed is None:
            allowed = self._decide(self._provides, self.provide, name)
        return allowed

    def may_publish(self, topic: str) -> bool:
        return self._publishes.get(topic) or self._decide(self._publishes, self.publish,
                                                          topic)

    def may_subscribe(self, topic: str) -> bool:
        return self._subscribes.get(topic) or self._decide(self._subscribes, self.subscribe,
                                                           topic)

    def may_see(self, user: str) -> bool:
        """Whether ``user``'s presence may be seen (the ``presence`` globs)."""
        return self._sees.get(user) or self._decide(self._sees, self.presence, user)

    def _decide(self, cache: dict[str, bool], patterns: tuple[str, ...], name: str) -> bool:
        allowed = any(fnmatchcase(name, pattern) for pattern in patterns)
        if allowed:
            if len(cache) >= self.CACHE:
                cache.clear()
            cache[name] = True
        return allowed


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str | None
    token_sha256: str | None
    permissions: Permissions
    max_connections: int        # 0: no limit
    rate_messages: int | None   # None: the [limits] default
    rate_bytes: int | None
    max_provided: int | None = None  # names provided at once; None: the [limits] default
    grant: Grant | None = None       # a JWT user: what its token grants (broker/tokens.py)
    mapped: bool = False             # a JWT user a file user's ``token_sub`` names: that user

    @property
    def key(self) -> str:
        """What the node counts this user's connections, rate and provided names under: a
        JWT's ``sub`` is not the file user of the same name (a token signed for ``admin``
        does not share the ``[auth.users.admin]`` user's limits, nor use them up), unless
        that user's ``token_sub`` names it."""
        return self.name if self.grant is None or self.mapped else f"token:{self.name}"


#: the glob lists of a user, a role or a token
LISTS = ("call", "provide", "publish", "subscribe", "presence")
_USER_KEYS = {"password", "token_sha256", "token_sub", "roles", *LISTS, "max_connections",
              "rate_messages", "rate_bytes", "max_provided"}


def _patterns(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise AuthConfigError(f"{where}: must be a list of glob patterns")
    return tuple(value)


def _count(where: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise AuthConfigError(f"{where}: must be a whole number, 0 or more")
    return value


class Users:
    """The users of ``[auth.users]`` with the roles of ``[auth.roles]``; raises
    AuthConfigError naming the first bad entry."""

    def __init__(self, users: Mapping[str, Any], roles: Mapping[str, Any]) -> None:
        role_perms: dict[str, tuple[tuple[str, ...], ...]] = {}
        self.roles = role_perms
        for role, entry in roles.items():
            where = f"auth.roles.{role}"
            if not isinstance(entry, Mapping) or set(entry) - set(LISTS):
                raise AuthConfigError(f"{where}: a table of glob lists: "
                                      f"{', '.join(LISTS)}")
            role_perms[role] = tuple(_patterns(f"{where}.{key}", entry.get(key, []))
                                     for key in LISTS)
        self.by_name: dict[str, User] = {}
        self.by_token: dict[str, User] = {}
        self.by_sub: dict[str, str] = {}  # a JWT's sub -> the file user it counts as
        for name, entry in users.items():
            where = f"auth.users.{name}"
            if not isinstance(entry, Mapping):
                raise AuthConfigError(f"{where}: must be a table")
            unknown = set(entry) - _USER_KEYS
            if unknown:
                raise AuthConfigError(f"{where}: unknown key {sorted(unknown)[0]}")
            password = entry.get("password")
            if password is not None:
                try:
                    _parse_hash(password)
                except (ValueError, TypeError) as exc:
                    raise AuthConfigError(f"{where}.password: {exc}") from None
            token = entry.get("token_sha256")
            if token is not None:
                if not isinstance(token, str) or len(token) != 64 or \
                        set(token) - set("0123456789abcdef"):
                    raise AuthConfigError(f"{where}.token_sha256: 64 lower-case hex digits")
                if token in self.by_token:
                    raise AuthConfigError(f"{where}.token_sha256: shared with another user")
            sub = entry.get("token_sub")
            if sub is not None:
                if not isinstance(sub, str) or not 0 < len(sub) <= 128:
                    raise AuthConfigError(f"{where}.token_sub: a JWT's sub, 1-128 characters")
                if sub in self.by_sub:
                    raise AuthConfigError(f"{where}.token_sub: {sub!r} is already "
                                          f"auth.users.{self.by_sub[sub]}'s")
                self.by_sub[sub] = name
            if password is None and token is None and sub is None:
                raise AuthConfigError(f"{where}: needs a password, a token_sha256 or a "
                                      "token_sub")
            for role in _patterns(f"{where}.roles", entry.get("roles", [])):
                if role not in role_perms:
                    raise AuthConfigError(f"{where}.roles: no role {role!r} in auth.roles")
            user = self._user(name, entry, where, password, token)
            self.by_name[name] = user
            if token is not None:
                self.by_token[token] = user

    def _user(self, name: str, entry: Mapping[str, Any], where: str,
              password: str | None = None, token: str | None = None,
              grant: Grant | None = None) -> User:
        lists = [list(_patterns(f"{where}.{key}", entry.get(key, []))) for key in LISTS]
        for role in entry.get("roles", []):
            if role in self.roles:   # a token's role this node lacks grants nothing
                for mine, granted in zip(lists, self.roles[role], strict=True):
                    mine += granted
        rate = {k: (_count(f"{where}.{k}", entry[k]) if k in entry else None)
                for k in ("rate_messages", "rate_bytes", "max_provided")}
        return User(name, password, token,
                    Permissions(*(tuple(dict.fromkeys(mine)) for mine in lists)),
                    _count(f"{where}.max_connections", entry.get("max_connections", 0)),
                    rate["rate_messages"], rate["rate_bytes"], rate["max_provided"], grant)

    def granted(self, grant: Grant) -> User:
        """The user a verified token makes, with this table's roles (its claims were
        checked by broker/tokens.py): under the name of the file user whose ``token_sub``
        is its ``sub``, if one is."""
        mapped = self.by_sub.get(grant.user)
        user = self._user(mapped or grant.user, grant.claims, "token", grant=grant)
        return user if mapped is None else replace(user, mapped=True)

    def by_token_value(self, token: str) -> User | None:
        """The user a presented token belongs to (looked up by its digest)."""
        return self.by_token.get(token_digest(token))
