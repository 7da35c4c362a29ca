"""Redis clients for a ``cluster.redis_url``: one Redis, or a master found through Sentinel.

- ``redis://[user:password@]host:port/db`` and ``rediss://`` (TLS): redis-py's own URLs.
- ``redis+sentinel://[user:password@]host1:26379,host2:26379/MASTER[/db]``: ask the
  Sentinels which Redis is the master named MASTER and connect there; after a
  failover the connection breaks, the bus reconnects (with backoff) and the
  Sentinels name the new master. The credentials are the master's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

SENTINEL = "redis+sentinel://"


def client(url: str, **options: Any) -> aioredis.Redis:
    """A client for ``url`` (see the module docstring); ``options`` go to redis-py."""
    if not url.startswith(SENTINEL):
        return aioredis.Redis.from_url(url, **options)
    sentinels, master, auth = parse_sentinel_url(url)
    finder = Sentinel(sentinels, sentinel_kwargs={"socket_timeout": 2.0,
                                                  "socket_connect_timeout": 2.0})
    return finder.master_for(master, **auth, **options)


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """(sentinel addresses, master name, master's credentials and db) of a sentinel URL."""
    rest = url[len(SENTINEL):]
    netloc, _, path = rest.partition("/")
    creds, _, hosts = netloc.rpartition("@")
    auth: dict[str, Any] = {}
    if creds:
        user, _, password = creds.partition(":")
        if user:
            auth["username"] = unquote(user)
        if password:
            auth["password"] = unquote(password)
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"sentinel address {host!r}: want host:port")
        sentinels.append((name.strip("[]"), int(port)))
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ValueError("a sentinel URL names the master: redis+sentinel://h:26379/MASTER")
    auth["db"] = int(parts[1]) if len(parts) > 1 else 0
    return sentinels, parts[0], auth
