"""One typed configuration: defaults ← TOML file ← ``RPCBUS_SECTION_KEY`` env vars ← CLI flags.

conf/rpcbus.toml lists every option with its default (a test keeps the two in
step). Unknown sections or keys, in the file or in ``RPCBUS_*`` variables, are
errors that name the key; so are values of the wrong type or out of range.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rpcbus.cluster.settings import ClusterSection

ENV_PREFIX = "RPCBUS_"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the text names the key."""


@dataclass
class NodeSection:
    name: str = ""              # empty: "node-" + a random suffix
    host: str = "127.0.0.1"
    port: int = 6020


@dataclass
class RpcSection:
    ack_timeout: float = 1.0        # the floor of each target's ack timeout
    ack_timeout_max: float = 10.0   # its ceiling (broker/admission.py)
    queue_target: float = 0.1       # s a call may wait for a slot before the queue stands
    queue_interval: float = 0.1     # s waits stay over the target before arrivals are shed
    max_concurrency: int = 10000    # attempts one target may hold at most
    response_timeout: float = 10.0
    max_timeout: float = 300.0
    timer_granularity: float = 0.01
    weights_file: str = ""          # provider weights (rpcbus analyze's weights.json); "" = all 1


@dataclass
class LimitsSection:
    max_frame_bytes: int = 1 << 20
    max_name_length: int = 128
    max_names_per_message: int = 1000
    max_messages_per_frame: int = 10000
    max_provided_per_connection: int = 1000
    max_subscriptions_per_connection: int = 1000
    max_event_buffer_bytes: int = 256 << 10  # a subscriber's; beyond, its events are lost
    max_fanout: int = 128           # providers one call_all may reach; 0: no limit
    max_provided_per_user: int = 10000
    max_invalid_messages: int = 10
    invalid_window: float = 10.0
    max_inflight_per_connection: int = 10000
    max_write_buffer_bytes: int = 64 << 20
    auth_timeout: float = 10.0
    max_handshake_bytes: int = 16384     # the HTTP upgrade request; more: 431, closed
    max_bytes_before_auth: int = 65536   # received after the handshake, before AUTH_OK
    max_control_frames: int = 20         # WebSocket pings and pongs per invalid_window
    max_connections: int = 0             # 0: the open-file limit less 256
    max_connections_per_address: int = 1024
    max_unauthenticated: int = 1024      # connections not logged in yet, all addresses
    max_unauthenticated_per_address: int = 256
    rate_window: float = 1.0
    rate_messages: int = 0          # requests per window and user; 0: no limit
    rate_bytes: int = 0             # bytes received per window and user; 0: no limit


@dataclass
class AuthSection:
    mode: str = "users"             # "none" only when set explicitly
    max_failures: int = 3
    users: dict[str, Any] = field(default_factory=dict)
    roles: dict[str, Any] = field(default_factory=dict)
    # JWT tokens (broker/tokens.py): label -> PEM public key file; several for rotation
    token_keys: dict[str, Any] = field(default_factory=dict)
    token_issuer: str = "rpcbus"    # "" = any issuer
    token_audience: str = "rpcbus"  # "" = any audience
    token_leeway: float = 5.0       # s of slack for the issuer's clock
    token_max_ttl: float = 86_400.0  # s a token may still live when presented; more: refused


@dataclass
class ServerSection:
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    close_timeout: float = 5.0
    drain_timeout: float = 10.0
    uvloop: bool = True
    tls_cert: str = ""
    tls_key: str = ""
    per_rpc_metrics: bool = True
    admin_token_sha256: str = ""    # "" = /metrics /stats /cluster /dashboard open to all


@dataclass
class HistorySection:
    dir: str = ""                   # empty: no load history
    window: float = 10.0
    max_queued: int = 1000


@dataclass
class DeepstreamSection:
    enabled: bool = False           # serve deepstream's own clients (docs/deepstream.md)
    path: str = "/deepstream"       # the client port's path they connect to
    response_timeout: float = 10.0  # s a deepstream client's call may take (it sends none)


@dataclass
class LogSection:
    level: str = "info"
    format: str = "auto"
    levels: dict[str, Any] = field(default_factory=dict)   # module prefix -> level


@dataclass
class Config:
    node: NodeSection = field(default_factory=NodeSection)
    rpc: RpcSection = field(default_factory=RpcSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    server: ServerSection = field(default_factory=ServerSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    history: HistorySection = field(default_factory=HistorySection)
    deepstream: DeepstreamSection = field(default_factory=DeepstreamSection)
    log: LogSection = field(default_factory=LogSection)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


_CHOICES = {
    ("auth", "mode"): ("none", "users"),
    ("cluster", "seal"): ("none", "sign", "encrypt"),
    ("cluster", "policy"): ("local-first", "cluster"),
    ("log", "level"): ("debug", "info", "warning", "error"),
    ("log", "format"): ("auto", "json", "console"),
}
_MAY_BE_UNSET = {("cluster", "seal")}   # "": not chosen (the default); _validate decides
_MAY_BE_ZERO = {("node", "port"), ("auth", "token_leeway"),
                ("server", "ping_interval"), ("server", "ping_timeout"),
                ("limits", "rate_messages"), ("limits", "rate_bytes"),
                ("limits", "max_provided_per_connection"), ("limits", "max_provided_per_user"),
                ("limits", "max_fanout"), ("limits", "max_subscriptions_per_connection"),
                ("limits", "max_connections"), ("limits", "max_connections_per_address"),
                ("limits", "max_unauthenticated"),
                ("limits", "max_unauthenticated_per_address")}


def _coerce(key: str, kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, str):
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        if type(value) is bool:
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        elif type(value) is int:
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if kind is float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        elif type(value) in (int, float):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if kind is dict:
        if isinstance(value, str):  # from the environment: a JSON object
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a JSON object") from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _field_types(section: Any) -> dict[str, type]:
    hints = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict,
             "dict[str, Any]": dict}
    return {f.name: hints[str(f.type)] for f in dataclasses.fields(section)}


def _apply(config: Config, values: Mapping[str, Mapping[str, Any]], origin: str) -> None:
    for section_name, entries in values.items():
        section = getattr(config, section_name, None) if section_name in _sections() else None
        if section is None:
            raise ConfigError(f"{origin}: unknown section [{section_name}]")
        if not isinstance(entries, Mapping):
            raise ConfigError(f"{origin}: [{section_name}] must be a table")
        types = _field_types(section)
        for key, value in entries.items():
            if key not in types:
                near = difflib.get_close_matches(key, types, n=1)
                hint = ""
                if near and origin == "environment":
                    hint = f" (did you mean {ENV_PREFIX}{section_name.upper()}_{near[0].upper()}?)"
                elif near:
                    hint = f" (did you mean {section_name}.{near[0]}?)"
                raise ConfigError(f"{origin}: unknown key {section_name}.{key}{hint}")
            setattr(section, key, _coerce(f"{origin}: {section_name}.{key}", types[key], value))


def _sections() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Config))


def _env_values(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    sections = sorted(_sections(), key=len, reverse=True)
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX):].lower()
        for section in sections:
            if rest.startswith(section + "_"):
                out.setdefault(section, {})[rest[len(section) + 1:]] = value
                break
        # else: not a node setting (RPCBUS_URL for rpcbus call, a tool's own RPCBUS_*):
        # not ours to refuse. A misspelt key inside a section is refused by _apply.
    return out


def _validate(config: Config) -> None:
    for section_name in _sections():
        section = getattr(config, section_name)
        for key, kind in _field_types(section).items():
            value = getattr(section, key)
            choices = _CHOICES.get((section_name, key))
            if choices is not None and value not in choices and not (
                    value == "" and (section_name, key) in _MAY_BE_UNSET):
                raise ConfigError(f"{section_name}.{key}: must be one of {', '.join(choices)}")
            if kind in (int, float) and (section_name, key) not in _MAY_BE_ZERO and value <= 0:
                raise ConfigError(f"{section_name}.{key}: must be positive, got {value}")
            if kind in (int, float) and value < 0:
                raise ConfigError(f"{section_name}.{key}: must not be negative, got {value}")
    if not 0 <= config.node.port <= 65535:
        raise ConfigError(f"node.port: must be 0-65535, got {config.node.port}")
    if config.rpc.response_timeout > config.rpc.max_timeout:
        raise ConfigError("rpc.response_timeout: must not exceed rpc.max_timeout")
    if config.deepstream.response_timeout > config.rpc.max_timeout:
        raise ConfigError("deepstream.response_timeout: must not exceed rpc.max_timeout")
    ds_path = config.deepstream.path
    if not ds_path.startswith("/") or ds_path == "/" or "?" in ds_path:
        raise ConfigError(f"deepstream.path: a path such as /deepstream, got {ds_path!r}")
    for module, level in config.log.levels.items():
        if level not in _CHOICES[("log", "level")]:
            raise ConfigError(f"log.levels.{module}: must be one of "
                              f"{', '.join(_CHOICES[('log', 'level')])}")
    digest = config.server.admin_token_sha256
    if digest and (len(digest) != 64 or set(digest) - set("0123456789abcdef")):
        raise ConfigError("server.admin_token_sha256: 64 lower-case hex digits "
                          "(rpcbus new-token prints them)")
    if bool(config.server.tls_cert) != bool(config.server.tls_key):
        raise ConfigError("server.tls_cert and server.tls_key: set both or neither")
    from rpcbus.broker.auth import AuthConfigError, Users
    try:
        Users(config.auth.users, config.auth.roles)  # raises on a bad user or role
    except AuthConfigError as exc:
        raise ConfigError(str(exc)) from None
    from rpcbus.broker import tokens
    try:
        tokens.load_keys(config.auth.token_keys)
    except tokens.TokenConfigError as exc:
        raise ConfigError(str(exc)) from None
    cluster = config.cluster
    if cluster.redis_url:
        from rpcbus.cluster.redisconn import check_url
        try:
            check_url(cluster.redis_url)
        except ValueError as exc:
            raise ConfigError(f"cluster.redis_url: {exc}") from None
    if cluster.seal == "":  # not chosen: unsealed is fine only where no one else reaches
        from rpcbus.cluster.redisconn import on_loopback
        if cluster.redis_url and not on_loopback(cluster.redis_url):
            raise ConfigError(
                "cluster.seal is not set and cluster.redis_url is not on loopback: anyone "
                "who can publish on that Redis could make this node run calls. Set "
                "cluster.seal = \"sign\" or \"encrypt\" with [cluster.keys] (rpcbus "
                "new-key), or cluster.seal = \"none\" to accept an unsealed bus "
                "(RPCBUS_CLUSTER_SEAL=none)")
        cluster.seal = "none"
        cluster.loopback_only = True  # and what the URL leads to: cluster/redisconn.py
    if cluster.seal != "none":
        from rpcbus.cluster.seal import SealError, load_keys
        try:
            load_keys(cluster.keys, cluster.key_id)
        except SealError as exc:
            raise ConfigError(f"cluster.keys: {exc}") from None


def check_serving(config: Config) -> None:
    """What a node needs beyond a valid config: someone who may log in, or auth off on
    purpose. Raises ConfigError saying how to fix it."""
    if config.auth.mode == "users" and not config.auth.users and not config.auth.token_keys:
        raise ConfigError(
            "auth.mode is \"users\" (the default) but no [auth.users.NAME] and no "
            "[auth.token_keys] are configured: add users or a token key "
            "(docs/security.md), or run without authentication by setting "
            "auth.mode = \"none\" explicitly (--auth none, RPCBUS_AUTH_MODE=none)")


def load(path: str | Path | None = None, env: Mapping[str, str] | None = None,
         overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Build the configuration; raises ConfigError naming the first bad key."""
    config = Config()
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        _apply(config, data, str(path))
    _apply(config, _env_values(os.environ if env is None else env), "environment")
    if overrides:
        _apply(config, {s: {k: v for k, v in e.items() if v is not None}
                        for s, e in overrides.items()}, "command line")
    _validate(config)
    return config
