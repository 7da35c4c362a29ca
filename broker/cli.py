"""The ``rpcbus`` command: ``node``, ``call``, ``demo``, ``cluster up``, ``status``,
``config --defaults``, and the secrets helpers ``hash-password``, ``new-token``,
``new-key``, ``token keygen|issue`` (broker/token_cli.py); ``analyze``,
``history-gen`` and ``bench`` come from higher layers (entry points, see ``_Main``)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

from rpcbus import __version__
from rpcbus.broker import config as config_mod
from rpcbus.broker import logs
from rpcbus.broker.token_cli import token as token_group

COMMANDS = "rpcbus.commands"  # entry points: commands of higher layers (analyze, bench)


class _Main(click.Group):
    """The node's commands, and those other layers register as ``rpcbus.commands`` entry
    points, loaded only when used (so this layer never imports them). One whose extra is
    not installed says which to install, in one line."""

    def _plugins(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=COMMANDS)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        ep = self._plugins().get(name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except ImportError as exc:
            extra = f"rpcbus[{','.join(ep.extras)}]" if ep.extras else "rpcbus"
            message = f"rpcbus {name} needs {exc.name or exc}: pip install '{extra}'"

            @click.command(name, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def missing(args: tuple[str, ...]) -> None:
                raise click.ClickException(message)

            return missing
        return loaded if isinstance(loaded, click.Command) else None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="rpcbus",
                      message="%(prog)s %(version)s")
def main() -> None:
    """rpcbus: a clustered RPC broker. Clients provide and call named RPCs through any node."""


def _tune_gc(cluster: bool) -> None:
    """A node process's garbage collector, for a server's many short-lived objects.

    Every call makes a few container objects (a call, its messages) that reference
    counting frees; only the collector's passes over everything else cost. Collecting
    the youngest generation after 10,000 container allocations (net), not CPython's
    700, makes the passes over the older generations (which the defaults run every few
    thousand calls, over the whole heap with the link's sets of recent attempt keys)
    about 14 times rarer; ``gc.freeze`` leaves what start-up made (modules, functions, the
    configuration) out of them for good. The provider's node of a call across nodes runs
    ~4 % fewer instructions (docs/performance-archive.md); cyclic garbage, rare here (an
    exception's traceback), waits at most 10,000 allocations longer.
    """
    if cluster:  # imported by the node once it starts: made now, it is frozen too
        import rpcbus.cluster.link  # noqa: F401
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def use_uvloop(wanted: bool) -> str:
    """Install uvloop's event loop policy when wanted and installed; returns the loop's name."""
    if wanted:
        try:
            import uvloop
        except ImportError:
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    return "asyncio"


@main.command()
@click.option("--host", default=None, help="Address to listen on [127.0.0.1].")
@click.option("--port", type=int, default=None,
              help="Port for WebSocket and HTTP (0: any free) [6020].")
@click.option("--name", default=None, help="Node name [node-<random>].")
@click.option("--redis", "redis_url", default=None,
              help="Join the cluster on this Redis (redis://host:port/db).")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="TOML file (every option: rpcbus config --defaults).")
@click.option("--auth", "auth_mode", type=click.Choice(["users", "none"]), default=None,
              help="users: only [auth.users] may connect (the default); none: anyone may "
              "do anything (for a laptop; logged as a warning).")
@click.option("--deepstream", is_flag=True, default=None,
              help="Serve deepstream's own clients on /deepstream ([deepstream] enabled).")
def node(host: str | None, port: int | None, name: str | None, redis_url: str | None,
         config_file: str | None, auth_mode: str | None, deepstream: bool | None) -> None:
    """Run one broker node until SIGTERM or Ctrl-C (then drain and exit 0); SIGHUP reads
    the configuration again (users, permissions, limits, weights: docs/operations.md)."""
    from rpcbus.broker.node import Node

    overrides: dict[str, dict[str, Any]] = {
        "node": {"host": host, "port": port, "name": name},
        "cluster": {"redis_url": redis_url}, "auth": {"mode": auth_mode},
        "deepstream": {"enabled": deepstream or None}}
    try:
        cfg = config_mod.load(config_file, overrides=overrides)
        node_ = Node(cfg)
    except config_mod.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    node_.config_source = lambda: config_mod.load(config_file, overrides=overrides)
    logs.configure(cfg.log.level, cfg.log.format, cfg.log.levels, node=node_.name)
    loop_kind = use_uvloop(cfg.server.uvloop)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, node_.stop)
        loop.add_signal_handler(signal.SIGHUP, node_.reload)
        import structlog
        structlog.get_logger(module="rpcbus.cli").info("node_starting", loop=loop_kind,
                                                 host=cfg.node.host, port=cfg.node.port)
        await node_.run()

    _tune_gc(bool(cfg.cluster.redis_url))
    try:
        asyncio.run(run())
    except OSError as exc:  # the port is taken, the address is wrong, ...
        raise click.ClickException(
            f"cannot listen on {cfg.node.host}:{cfg.node.port}: {exc}") from None
    if node_.failed:
        raise click.ClickException(node_.failed)


@main.command("reload")
@click.option("--node", "url", default="ws://127.0.0.1:6020", show_default=True,
              envvar="RPCBUS_URL", show_envvar=True, help="The node (its client URL).")
@click.option("--admin-token", required=True, envvar="RPCBUS_ADMIN_TOKEN", show_envvar=True,
              help="The token whose digest is the node's server.admin_token_sha256.")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CA certificate to verify a wss:// node with.")
def reload_command(url: str, admin_token: str, ca_file: str | None) -> None:
    """Make a node read its configuration again, as SIGHUP does (users, permissions,
    limits, weights); prints what changed. Exit status 1 when the node refused it."""
    import ssl
    import urllib.error
    import urllib.request

    http = re.sub(r"^ws", "http", url.rstrip("/")) + "/reload"
    request = urllib.request.Request(http, data=b"", method="POST",
                                     headers={"Authorization": f"Bearer {admin_token}"})
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            click.echo(answer.read().decode().strip())
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{url}: {exc.read().decode().strip()}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") \
            from None


def _as_client(command: Any) -> Any:
    """The options a command that connects as a client takes: --url, --user, --password,
    --token, --ca-file."""
    for decorator in reversed((
        click.option("--url", default="ws://127.0.0.1:6020", show_default=True,
                     envvar="RPCBUS_URL", show_envvar=True, help="Node to connect to."),
        click.option("--user", default=None, help="User name (auth mode users)."),
        click.option("--password", default=None,
                     help="Password of --user (prompted when omitted)."),
        click.option("--token", default=None, envvar="RPCBUS_TOKEN", show_envvar=True,
                     help="A static token instead of user and password."),
        click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="CA certificate to verify a wss:// node with."),
    )):
        command = decorator(command)
    return command


def _as_client_run(url: str, user: str | None, password: str | None, token: str | None,
                   ca_file: str | None, work: Any) -> Any:
    """``await work(client)`` on a client of ``url``; an RpcError is one line, exit 1."""
    import rpcbus
    if not url.startswith(("ws://", "wss://")):
        raise click.BadParameter(f"{url!r} is not a ws:// or wss:// URL", param_hint="--url")
    if user and password is None and token is None:
        password = click.prompt("password", hide_input=True, err=True)

    async def run() -> Any:
        async with rpcbus.connect(url, user=user, password=password, token=token,
                                   ca_file=ca_file, reconnect=False) as c:
            return await work(c)

    logs.configure("warning", "auto")
    try:
        return asyncio.run(run())
    except rpcbus.RpcError as exc:
        click.echo(f"{exc.code}: {exc.message}", err=True)
        sys.exit(1)


@main.command()
@click.argument("rpc")
@click.argument("data", default="null")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds the call may take (more than 0).")
@_as_client
def call(rpc: str, data: str, timeout: float | None, url: str, user: str | None,
         password: str | None, token: str | None, ca_file: str | None) -> None:
    """Call RPC with DATA (JSON) once and print the answer as JSON (exit 1 on error)."""
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise click.UsageError(f"DATA is not JSON: {exc}") from None
    result = _as_client_run(url, user, password, token, ca_file,
                            lambda c: c.call(rpc, payload, timeout=timeout))
    click.echo(json.dumps(result, default=repr))


@main.command()
@click.argument("rpc", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_as_client
def rpcs(rpc: str | None, as_json: bool, url: str, user: str | None, password: str | None,
         token: str | None, ca_file: str | None) -> None:
    """What the cluster provides that you may call, with its providers per node; with
    RPC, its providers across the cluster and their last minute (calls, errors, p50, p99)."""
    found = _as_client_run(url, user, password, token, ca_file,
                           (lambda c: c.providers(rpc)) if rpc else (lambda c: c.rpcs()))
    if as_json:
        click.echo(json.dumps(found, indent=1))
    elif rpc is None:
        click.echo(f"{'rpc':40} {'providers':>9}  nodes")
        for r in found:
            nodes = " ".join(f"{n}:{c:g}" for n, c in sorted(r["nodes"].items()))
            click.echo(f"{r['rpc']:40} {r['providers']:>9g}  {nodes}")
    else:
        click.echo(f"{'provider':32} {'node':12} {'weight':>6} {'calls':>7} {'errors':>6} "
                   f"{'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8}")
        for r in found:
            if r["provider"] is None:
                click.echo(f"{'(' + str(r['count']) + ' not listed)':32} {r['node']:12}")
                continue
            click.echo(f"{r['provider']:32} {r['node']:12} {r['weight']:>6g} "
                       f"{_cell(r['calls']):>7} {_cell(r['errors']):>6} "
                       f"{_cell(r['p50_ms']):>8} {_cell(r['p99_ms']):>8} "
                       f"{_cell(r['calls_per_s']):>8}")


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


@main.command()
@click.option("--calls", default=6, show_default=True, help="How many calls the demo makes.")
def demo(calls: int) -> None:
    """Start a 3-node cluster, provide RPCs on some nodes, call from others, stop cleanly."""
    from rpcbus.broker.demo import run_demo

    logs.configure("warning", "auto")
    sys.exit(asyncio.run(run_demo(calls)))


@main.group()
def cluster() -> None:
    """A local cluster for development and demos."""


@cluster.command("up")
@click.option("--nodes", default=3, show_default=True, help="How many nodes.")
@click.option("--base-port", default=6021, show_default=True,
              help="First node's port; the others follow (0: any free ports).")
@click.option("--redis", "redis_url", default=None,
              help="Use this Redis instead of starting an embedded redis-server.")
@click.option("--redis-shards", type=click.IntRange(min=0), default=0,
              help="Start an embedded Redis Cluster of this many masters (3 or more) "
              "instead of one redis-server; the bus uses sharded pub/sub.")
@click.option("--redis-replicas", type=click.IntRange(min=0), default=0,
              help="Replicas per master of the --redis-shards cluster.")
def cluster_up(nodes: int, base_port: int, redis_url: str | None, redis_shards: int,
               redis_replicas: int) -> None:
    """Run redis-server (or a Redis Cluster) and N nodes until Ctrl-C or SIGTERM, then
    stop them all. Each node's log goes to a file (its path is printed; the files stay
    after the stop); a node that exits meanwhile is reported at once, with its reason."""
    import threading

    from rpcbus.broker.local import LocalCluster
    from rpcbus.broker.process import NodeStartError

    stop = threading.Event()
    keys_file = ""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    if redis_shards and redis_url:
        raise click.UsageError("--redis-shards starts a Redis Cluster; --redis uses one "
                               "already running: give one of them")
    if 0 < redis_shards < 3:
        raise click.UsageError("--redis-shards: a Redis Cluster needs 3 masters or more")
    if redis_replicas and not redis_shards:
        raise click.UsageError("--redis-replicas goes with --redis-shards N")
    logs = tempfile.mkdtemp(prefix="rpcbus-logs-")
    local = LocalCluster(nodes=nodes, base_port=base_port, redis_url=redis_url,
                         redis_shards=redis_shards, redis_replicas=redis_replicas,
                         redis_node_timeout_ms=5000, seal=True, log_dir=logs)
    kind = ("given Redis" if redis_url else "embedded redis-server" if local.redis else
            f"embedded Redis Cluster: {redis_shards} masters, {redis_replicas} replicas each")
    click.echo(f"starting {nodes} node(s) on {local.redis_url} ({kind}) ...")
    try:
        try:
            local.start()
        except (NodeStartError, RuntimeError) as exc:  # a node or redis-server did not start
            raise click.ClickException(str(exc)) from None
        for node in local.nodes:
            click.echo(f"  {node.name:<4} {node.url}   (pid {node.pid})")
        click.echo(f"logs: {logs}/n1.log ... (JSON lines; tail -f to follow)")
        if local.keys:
            keys_file = _write_bus_keys(local)
            click.echo(f"the bus is signed with a key made for this run ({keys_file})")
            click.echo(f"status: rpcbus status --config {keys_file}    stop: Ctrl-C")
        else:  # RPCBUS_CLUSTER_SEAL in the environment chose the bus's seal
            click.echo(f"status: rpcbus status --redis {local.redis_url}    stop: Ctrl-C")
        reported: set[str] = set()
        while not stop.wait(0.5):
            for node in local.nodes:
                code = node.proc.poll() if node.proc is not None else None
                if code is not None and node.name not in reported:
                    reported.add(node.name)
                    why = ("it stopped as asked (SIGTERM or SIGINT: it drained)" if code == 0
                           else node.last_error())
                    click.echo(f"{node.name} exited with code {code}: {why} "
                               f"(log: {node.log_file})")
        click.echo("stopping: nodes drain their calls ...")
    finally:
        codes = local.stop()
        if keys_file:
            shutil.rmtree(os.path.dirname(keys_file), ignore_errors=True)
    click.echo("stopped: " + ", ".join(f"{n} exit {c}" for n, c in codes.items())
               + f"; logs kept in {logs}")
    sys.exit(0 if all(c == 0 for c in codes.values()) else 1)


def _write_bus_keys(local: Any) -> str:
    """A node config file (mode 0600, in a directory of its own) holding ``local``'s Redis
    and bus key, for ``rpcbus status --config`` and for nodes started by hand."""
    directory = tempfile.mkdtemp(prefix="rpcbus-cluster-")
    path = os.path.join(directory, "cluster.toml")
    keys = "".join(f'"{kid}" = "{key}"\n' for kid, key in local.keys.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'[cluster]\nredis_url = "{local.redis_url}"\nseal = "sign"\n'
                f'key_id = "{next(iter(local.keys))}"\n\n[cluster.keys]\n{keys}')
    return path


@main.command()
@click.option("--redis", "redis_url", default=None,
              help="Redis of the cluster, any form a node takes (redis+cluster://h1:p1,h2:p2/ "
              "too) [the config's, else redis://127.0.0.1:6379/0].")
@click.option("--namespace", default=None, help="Topic prefix [the config's: rpcbus].")
@click.option("--listen", default=2.5, show_default=True,
              help="Seconds to listen for heartbeats (longer than the nodes' "
              "cluster.heartbeat_interval, or some are missed).")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="A node's TOML file: its Redis, namespace and cluster keys.")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
@click.option("--watch", is_flag=True,
              help="Refresh the table every --listen seconds until Ctrl-C.")
def status(redis_url: str | None, namespace: str | None, listen: float,
           config_file: str | None, as_json: bool, watch: bool) -> None:
    """Show the live nodes and, per rpc name, which nodes provide it."""
    from rpcbus.cluster.seal import Sealer
    from rpcbus.cluster.status import collect, render

    try:
        cfg = config_mod.load(config_file).cluster
    except config_mod.ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    redis_url = redis_url or cfg.redis_url or "redis://127.0.0.1:6379/0"
    sealer = (Sealer(cfg.seal, cfg.keys, cfg.key_id, cfg.max_skew)
              if cfg.seal != "none" else None)
    ns = namespace or cfg.namespace

    def once() -> dict[str, Any]:
        try:
            return asyncio.run(collect(redis_url, ns, listen, sealer, cfg.redis_tls_ca))
        except asyncio.CancelledError:
            # Ctrl-C as collect's own listen timeout fires: asyncio.run sees two
            # cancellations and raises this instead of KeyboardInterrupt
            raise KeyboardInterrupt from None
        except Exception as exc:  # OSError, ConnectionError, a bad URL (ValueError), ...
            raise click.ClickException(f"cannot read {redis_url}: {exc}") from None

    if not watch:
        nodes = once()
        click.echo(json.dumps(nodes, indent=2, sort_keys=True) if as_json else render(nodes))
        return
    try:
        while True:  # each pass listens --listen seconds: that is the refresh interval
            nodes = once()
            if as_json:
                click.echo(json.dumps(nodes, sort_keys=True), nl=True)
            else:
                click.clear()
                click.echo(f"rpcbus status  {redis_url}  ({time.strftime('%H:%M:%S')}, "
                           f"every {listen:g} s, Ctrl-C to stop)\n")
                click.echo(render(nodes))
    except KeyboardInterrupt:
        pass


@main.command("config")
@click.option("--defaults", is_flag=True,
              help="Print every option with its default and what it does (TOML).")
@click.option("--user", "users", multiple=True, metavar="NAME",
              help="Add a user NAME who may call and provide everything, with a new "
              "token: its hash goes in the file, the token to stderr (repeat).")
@click.option("--systemd-unit", "unit", is_flag=True,
              help="Print the systemd unit that runs this install's `rpcbus node` "
              "(docs/operations.md, \"Under systemd\").")
def config_cmd(defaults: bool, users: tuple[str, ...], unit: bool) -> None:
    """Print the node's configuration file with every default (a starting point), or
    the systemd unit for this install.

    \b
        rpcbus config --defaults --user app > node.toml   # app's token on stderr
        rpcbus node --config node.toml --redis redis://127.0.0.1:6379/0
        rpcbus config --systemd-unit > /etc/systemd/system/rpcbus.service
    """
    from importlib.resources import files

    from rpcbus.broker.auth import new_token as make
    from rpcbus.broker.auth import token_digest

    if defaults == unit:
        raise click.UsageError("say what to print: --defaults or --systemd-unit")
    if unit:
        if users:
            raise click.UsageError("--user goes with --defaults")
        here = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "rpcbus")
        text = (files("rpcbus.conf") / "rpcbus.service").read_text(encoding="utf-8")
        click.echo(text.replace("/opt/rpcbus/bin/rpcbus", here), nl=False)
        return
    text = (files("rpcbus.conf") / "rpcbus.toml").read_text(encoding="utf-8")
    for name in users:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise click.BadParameter(f"{name!r}: letters, digits, '-' and '_' only",
                                     param_hint="--user")
        token = make()
        text += (f"\n[auth.users.{name}]                 # rpcbus config --user {name}\n"
                 f'token_sha256 = "{token_digest(token)}"\n'
                 'call = ["*"]\nprovide = ["*"]\n')
        click.echo(f"token of user {name} (give it to its programs: connect(url, "
                   f"token=...); only its hash is in the file): {token}", err=True)
    click.echo(text, nl=False)


@main.command("hash-password")
@click.option("--stdin", "from_stdin", is_flag=True,
              help="Read the password from the first line of stdin instead of a prompt.")
def hash_password(from_stdin: bool) -> None:
    """Print an scrypt hash of a password for [auth.users.NAME] password."""
    from rpcbus.broker.auth import hash_password as make

    if from_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise click.UsageError("an empty password")
    click.echo(make(password))


@main.command("new-token")
def new_token() -> None:
    """Print a new random token (give it to the client) and its token_sha256 (for the config)."""
    from rpcbus.broker.auth import new_token as make
    from rpcbus.broker.auth import token_digest

    token = make()
    click.echo(f"token         = {token}")
    click.echo(f'token_sha256  = "{token_digest(token)}"')


@main.command("new-key")
def new_key() -> None:
    """Print a new random cluster key for [cluster.keys]."""
    from rpcbus.cluster.seal import new_key as make

    click.echo(make())


main.add_command(token_group)

if __name__ == "__main__":
    main()
