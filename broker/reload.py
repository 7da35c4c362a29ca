"""What a configuration reload (SIGHUP, ``rpcbus reload``) may change in a running node.

Pure: two ``Config``s in, what to apply and what to ignore out. Users, roles and
their permissions, the token keys, issuer, audience and leeway, the login
failure limit, every ``[limits]`` value, the weights file and the admin token
change live; anything else (ports, the Redis URL, the
node's name, TLS files, timeouts, the history folder, logging) needs a restart and
is kept as it was, said in one line (``summary``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from rpcbus.broker.config import Config

#: (section, key) a reload applies; a whole section when the key is "*".
RELOADABLE = frozenset({("auth", "users"), ("auth", "roles"), ("auth", "max_failures"),
                        ("auth", "token_keys"), ("auth", "token_issuer"),
                        ("auth", "token_audience"), ("auth", "token_leeway"),
                        ("limits", "*"), ("rpc", "weights_file"),
                        ("server", "admin_token_sha256"), ("server", "drain_timeout")})


def _reloadable(section: str, key: str) -> bool:
    return (section, key) in RELOADABLE or (section, "*") in RELOADABLE


def changes(old: Config, new: Config) -> list[tuple[str, str]]:
    """Every (section, key) whose value differs between ``old`` and ``new``."""
    out = []
    for section in dataclasses.fields(old):
        before, after = getattr(old, section.name), getattr(new, section.name)
        for key in dataclasses.fields(before):
            if getattr(before, key.name) != getattr(after, key.name):
                out.append((section.name, key.name))
    return out


def merged(old: Config, new: Config) -> Config:
    """``new``'s reloadable values over ``old``'s (a new Config; neither is changed)."""
    out = copy.deepcopy(old)
    for section, key in changes(old, new):
        if _reloadable(section, key):
            setattr(getattr(out, section), key, copy.deepcopy(getattr(getattr(new, section),
                                                                      key)))
    return out


def summary(old: Config, new: Config) -> dict[str, Any]:
    """For the log line: the keys applied and the keys ignored."""
    said: dict[str, list[str]] = {"applied": [], "needs_restart": []}
    for section, key in changes(old, new):
        said["applied" if _reloadable(section, key) else "needs_restart"].append(
            f"{section}.{key}")
    return said
