"""What a client logs in with, and when it renews a token.

``token`` may be a string, or a function (plain or async) returning one: the SDK
calls it for every login (each connection, each reconnect) and, when the token is
a JWT with an ``exp``, again before it expires, sending the new one as AUTH on the
live connections (the node takes a new JWT of the same user without closing
anything: docs/security.md). A JWT is read here only for its ``exp`` and ``iat``;
the node checks its signature.

When: ``RENEW_BEFORE`` seconds before ``exp``, or a fifth of the token's life
(from ``iat``, else from when it was fetched) before it when that is shorter; a
renewal that fails is tried
again after ``RETRY`` seconds until the token expires (then the node ends the
session's rights, and the SDK renews as soon as a token comes).
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
from typing import Any, Awaitable, Callable, Union

RENEW_BEFORE = 60.0  # s before exp, at the latest
RETRY = 5.0          # s between tries of a renewal that failed

TokenSource = Union[str, Callable[[], Union[str, Awaitable[str]]]]


def jwt_times(token: str) -> tuple[float, float | None] | None:
    """A JWT's ``(exp, iat)`` read without checking it; None for a token that is not a
    JWT or carries no numeric ``exp``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        return None
    iat = claims.get("iat")
    return float(exp), (float(iat) if isinstance(iat, (int, float))
                        and not isinstance(iat, bool) else None)


def renew_in(token: str, now: float) -> float | None:
    """Seconds from ``now`` (the wall clock) until ``token`` should be renewed; None
    when it never needs to be (not a JWT with an ``exp``)."""
    times = jwt_times(token)
    if times is None:
        return None
    exp, iat = times
    life = exp - (iat if iat is not None and iat <= now else now)
    return max(0.0, exp - min(RENEW_BEFORE, life / 5) - now)


class Credentials:
    """The AUTH fields of one client: a user and password, or a token (a source)."""

    def __init__(self, user: str | None, password: str | None,
                 token: TokenSource | None) -> None:
        if token is not None and not (isinstance(token, str) or callable(token)):
            raise TypeError("token must be a string or a function returning one")
        self.user, self.password, self.source = user, password, token
        self.token: str | None = token if isinstance(token, str) else None  # the last one

    @property
    def renews(self) -> bool:
        """True when a new token can be had (the token is a function)."""
        return callable(self.source)

    async def fetch(self) -> str | None:
        """The token to log in with now: the function's answer (awaited when it is a
        coroutine), or the string given. Errors the function raises propagate."""
        source = self.source
        if callable(source):
            got: Any = source()
            if inspect.isawaitable(got):
                got = await got
            if not isinstance(got, str) or not got:
                raise TypeError(f"the token function returned {type(got).__name__}, "
                                "not a token")
            self.token = got
        return self.token

    async def params(self) -> dict[str, Any]:
        """The AUTH fields for a new login."""
        token = await self.fetch()
        return {k: v for k, v in (("user", self.user), ("password", self.password),
                                  ("token", token)) if v}
