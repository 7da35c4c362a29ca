"""The forms of a ``cluster.redis_url`` and how to read them (the bus connects with
cluster/resp.py and cluster/shards.py; redis-py reads the plain URLs).

- ``redis://[user:password@]host:port/db`` and ``rediss://`` (TLS): redis-py's own URLs.
- ``redis+sentinel://[user:password@]host1:26379,host2:26379/MASTER[/db]``: ask the
  Sentinels which Redis is the master named MASTER and connect there; after a
  failover the connection breaks, the bus reconnects (with backoff) and the
  Sentinels name the new master. The credentials are the master's.
- ``redis+cluster://[user:password@]host1:7000,host2:7001/`` (``rediss+cluster://``: TLS,
  with ``?ssl_cert_reqs=none`` as for ``rediss://``): a Redis Cluster, found from these
  seed nodes; the bus uses sharded pub/sub on it (cluster/shards.py). Only database 0.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import unquote

from redis.asyncio.connection import parse_url

SENTINEL = "redis+sentinel://"
CLUSTER = ("redis+cluster://", "rediss+cluster://")


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


def is_cluster(url: str) -> bool:
    return url.startswith(CLUSTER)


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict[str, Any], bool]:
    """(seed addresses, redis-py's options for each shard: credentials, ``ssl_cert_reqs``,
    TLS or not) of a ``redis+cluster://`` or ``rediss+cluster://`` URL. Raises ValueError
    saying what is wrong."""
    secure = url.startswith("rediss+")
    scheme, _, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    seeds = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"Redis Cluster seed {host!r}: want host:port "
                             f"({scheme}://host1:7000,host2:7001/)")
        seeds.append((name.strip("[]"), int(port)))
    path, _, query = tail.partition("?")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"Redis Cluster has only database 0, not {path.strip('/')!r}")
    # one seed as a plain URL: redis-py reads the credentials and TLS options as usual
    one = f"{'rediss' if secure else 'redis'}://{creds}{at}{hosts.split(',')[0]}/0"
    options = dict(parse_url(one + (f"?{query}" if query else "")))
    for key in ("host", "port", "db"):
        options.pop(key, None)
    return seeds, options, secure


def check_url(url: str) -> None:
    """Raise ValueError saying what is wrong with a ``cluster.redis_url`` (any form above)."""
    if is_cluster(url):
        parse_cluster_url(url)
    elif url.startswith(SENTINEL):
        parse_sentinel_url(url)
    elif not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{url!r}: want redis://, rediss://, unix://, redis+sentinel:// "
                         "or redis+cluster:// (docs/operations.md)")
    else:
        parse_url(url)


def on_loopback(url: str) -> bool:
    """True when every host a ``cluster.redis_url`` names (seeds, Sentinels) is a loopback
    address or ``localhost``, or it is a unix socket: no other machine reaches that Redis.
    A URL that does not parse is not on loopback."""
    if url.startswith("unix://"):
        return True
    try:
        if is_cluster(url):
            hosts = [host for host, _ in parse_cluster_url(url)[0]]
        elif url.startswith(SENTINEL):
            hosts = [host for host, _ in parse_sentinel_url(url)[0]]
        else:
            hosts = [parse_url(url).get("host", "localhost")]
    except ValueError:
        return False
    return all(_loopback_host(host) for host in hosts)


class NotOnLoopback(ConnectionError):
    """The bus is unsealed because its Redis was on loopback, and a Redis it would use now
    is not (the master a Sentinel names, a Redis Cluster node): refused before connecting."""


def require_loopback(hosts: list[tuple[str, int]], what: str) -> None:
    """NotOnLoopback unless every (host, port) in ``hosts`` is on loopback."""
    away = [f"{host}:{port}" for host, port in hosts if not _loopback_host(host)]
    if away:
        raise NotOnLoopback(
            f"{what} {', '.join(away[:3])} is not on loopback, and the bus is unsealed "
            "because cluster.redis_url was: set cluster.seal to sign or encrypt (or to "
            "none to accept an unsealed bus there)")


def _loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it could resolve anywhere
        return False
