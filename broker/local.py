"""A local cluster for development, demos and tests: an embedded redis-server and nodes.

``RedisServer`` runs ``redis-server`` on a free loopback port with nothing
kept on disk (tests kill, pause and restart it on the same port);
``RedisCluster`` a Redis Cluster of such servers (``redis-cli --cluster create``).
``LocalCluster`` adds N node processes (broker/process.py) and stops
everything — nodes first, with SIGTERM so they drain — on ``stop()``; with
``seal=True`` their bus is signed with a key made for it (``keys``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from rpcbus.broker.process import NodeProcess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisSentinel:
    """A ``redis-server --sentinel`` on a free loopback port watching one master."""

    def __init__(self, master_port: int, name: str = "rpcbus", directory: str = "/tmp") -> None:
        self.port = free_port()
        self.name = name
        self.config = os.path.join(directory, f"sentinel-{self.port}.conf")
        with open(self.config, "w") as f:  # sentinel rewrites its config file: its own copy
            f.write(f"port {self.port}\nbind 127.0.0.1\n"
                    f"sentinel monitor {name} 127.0.0.1 {master_port} 1\n"
                    f"sentinel down-after-milliseconds {name} 500\n"   # quick, for tests
                    f"sentinel failover-timeout {name} 2000\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> "RedisSentinel":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (./dev setup installs it)")
        self.proc = subprocess.Popen([exe, self.config, "--sentinel"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_server(self.proc, self.port, timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)


def wait_for_server(proc: subprocess.Popen[Any], port: int, timeout: float = 10.0,
                    say: bytes = b"PING\r\n", answers: tuple[bytes, ...] = (b"+", b"-"),
                    name: str = "redis-server") -> None:
    """Until the child ``proc`` answers on ``port``: sends ``say`` (if any) and waits for a
    reply starting with one of ``answers`` (Redis: PONG, or NOAUTH with ACL users)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # a child process: nothing to await but its port
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                if say:
                    s.sendall(say)
                if s.recv(16).startswith(answers):
                    return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{name} did not answer on port {port}")


class RedisServer:
    def __init__(self, port: int | None = None, args: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.args = args or []   # more redis-server options (ACL users, ...)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (./dev setup installs it)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes", "--loglevel", "warning",
             *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # a Ctrl-C at the terminal: stopped after the nodes
        wait_for_server(self.proc, self.port, timeout)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class RedisCluster:
    """A Redis Cluster on free loopback ports: ``shards`` masters (at least 3, as
    ``redis-cli --cluster create`` wants), each with ``replicas`` replicas, nothing kept on
    disk but each server's cluster config (in ``directory``). ``node_timeout_ms``: how long
    a master may be silent before its replica takes over (Redis' default is 15,000).
    ``user``: (name, password, ACL rules) of a user the URL names (the default user, which
    administers the cluster here, stays as it is). ``tls``: (certificate, key) PEM files
    (the certificate also the CA): clients and the cluster bus then speak TLS on each
    server's ``tls_port``, which the cluster announces; its plain port stays for
    administration here."""

    def __init__(self, shards: int = 3, replicas: int = 0, directory: str = "",
                 node_timeout_ms: int = 2000, user: tuple[str, str, str] | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        if shards < 3:
            raise ValueError("a Redis Cluster needs at least 3 shards (masters)")
        self.shards, self.replicas, self.user, self.tls = shards, replicas, user, tls
        self._made_directory = not directory  # removed on stop() only if made here
        self.directory = directory or tempfile.mkdtemp(prefix="rpcbus-redis-cluster-")
        acl = [] if user is None else ["--user", user[0], "on", f">{user[1]}",
                                       *user[2].split()]
        self.tls_ports: dict[int, int] = {}
        self.servers: list[RedisServer] = []
        for _ in range(shards * (1 + replicas)):
            port = free_port()
            args = ["--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                    "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-require-full-coverage", "no", "--dir", self.directory, *acl]
            if tls:
                self.tls_ports[port] = free_port()
                args += ["--tls-port", str(self.tls_ports[port]), "--tls-cert-file", tls[0],
                         "--tls-key-file", tls[1], "--tls-ca-cert-file", tls[0],
                         "--tls-auth-clients", "no", "--tls-cluster", "yes",
                         "--tls-replication", "yes"]
            self.servers.append(RedisServer(port, args))

    @property
    def url(self) -> str:
        """The URL nodes take: every server as a seed."""
        creds = "" if self.user is None else f"{self.user[0]}:{self.user[1]}@"
        return (f"{'rediss' if self.tls else 'redis'}+cluster://{creds}"
                + ",".join(f"127.0.0.1:{self._client_port(s)}" for s in self.servers) + "/")

    def _client_port(self, server: RedisServer) -> int:
        return self.tls_ports.get(server.port, server.port)

    def start(self, timeout: float = 30.0) -> "RedisCluster":
        exe = shutil.which("redis-cli")
        if exe is None:
            raise RuntimeError("redis-cli is not installed (./dev setup installs it)")
        try:
            for server in self.servers:
                server.start()
            tls = [] if self.tls is None else ["--tls", "--cacert", self.tls[0]]
            subprocess.run(  # the first `shards` servers become the masters
                [exe, "--cluster", "create",
                 *(f"127.0.0.1:{self._client_port(s)}" for s in self.servers),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes", *tls],
                check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, timeout=timeout)
            deadline = time.monotonic() + timeout
            while not all(self.ready(s) for s in self.servers):  # child processes: poll
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not become ready "
                                       f"in {timeout:g} s")
                time.sleep(0.1)
        except subprocess.CalledProcessError as exc:
            self.stop()
            raise RuntimeError("redis-cli --cluster create failed: "
                               + exc.stderr.decode(errors="replace").strip()) from None
        except BaseException:
            self.stop()
            raise
        return self

    def command(self, server: RedisServer, *args: str) -> Any:
        """One command to ``server`` (redis-py; raises on an error reply)."""
        import redis

        with redis.Redis(port=server.port, socket_timeout=5) as client:
            return client.execute_command(*args)

    def slots(self, server: RedisServer | None = None) -> list[Any]:
        """``CLUSTER SLOTS`` as ``server`` (else the first live one) sees it."""
        for one in [server] if server else self.servers:
            if one.proc is not None and one.proc.poll() is None:
                return self.command(one, "CLUSTER", "SLOTS")  # type: ignore[no-any-return]
        raise RuntimeError("no server of the Redis Cluster is running")

    def master_of(self, channel: str) -> RedisServer:
        """The server that owns ``channel``'s slot now."""
        from redis.crc import key_slot

        slot = key_slot(channel.encode())
        for first, last, master, *_ in self.slots():
            if first <= slot <= last:
                return next(s for s in self.servers if self._client_port(s) == int(master[1]))
        raise RuntimeError(f"no master owns slot {slot}")

    def move_slot(self, channel: str, to: RedisServer) -> None:
        """Reshard: move ``channel``'s slot to the master ``to`` (``CLUSTER SETSLOT``
        IMPORTING / MIGRATING / NODE, as ``redis-cli --cluster reshard`` does per slot; the
        bus keeps no keys, so there are none to migrate)."""
        from redis.crc import key_slot

        slot = str(key_slot(channel.encode()))
        source = self.master_of(channel)
        ids = {s.port: self.command(s, "CLUSTER", "MYID").decode() for s in (source, to)}
        self.command(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
        self.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to.port])
        for server in (to, source):  # then every master learns it from these two
            self.command(server, "CLUSTER", "SETSLOT", slot, "NODE", ids[to.port])

    def ready(self, server: RedisServer) -> bool:
        """``server`` sees every slot served and knows every other server."""
        info = self.command(server, "CLUSTER", "INFO").decode()
        if not ("cluster_state:ok" in info and "cluster_slots_assigned:16384" in info
                and f"cluster_known_nodes:{len(self.servers)}" in info):
            return False
        replication = self.command(server, "INFO", "replication")  # a replica has its data
        return bool(replication["role"] == "master" or replication["master_link_status"] == "up")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        if self._made_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


class LocalCluster:
    def __init__(self, nodes: int = 3, base_port: int = 0, redis_url: str | None = None,
                 env: dict[str, str] | None = None, echo: bool = False,
                 node_env: list[dict[str, str]] | None = None,
                 redis_args: list[str] | None = None,
                 node_redis: dict[int, str] | None = None,
                 redis_shards: int = 0, redis_replicas: int = 0,
                 redis_node_timeout_ms: int = 2000, seal: bool = False,
                 log_dir: str | None = None) -> None:
        self.count = nodes
        self.log_dir = log_dir  # each node's log lines also go to LOG_DIR/NAME.log
        self.base_port = base_port
        # the embedded Redis: one server, or a Redis Cluster of ``redis_shards`` masters
        self.redis_cluster: RedisCluster | None = None
        self.redis: RedisServer | None = None
        if redis_shards and not redis_url:
            self.redis_cluster = RedisCluster(redis_shards, redis_replicas,
                                              node_timeout_ms=redis_node_timeout_ms)
            redis_url = self.redis_cluster.url
        elif not redis_url:
            self.redis = RedisServer(args=redis_args)
        self.redis_url = redis_url or self.redis.url  # type: ignore[union-attr]
        self.env = env or {}
        # seal: the bus signed with a key made here, unless env chooses a seal itself
        self.keys: dict[str, str] = {}
        if seal and "RPCBUS_CLUSTER_SEAL" not in {**os.environ, **self.env}:
            from rpcbus.cluster.seal import new_key
            self.keys = {"local": new_key()}
            self.env = {**self.env, "RPCBUS_CLUSTER_SEAL": "sign",
                        "RPCBUS_CLUSTER_KEY_ID": "local",
                        "RPCBUS_CLUSTER_KEYS": json.dumps(self.keys)}
        self.node_env = node_env or []   # per node i, on top of env
        self.node_redis = node_redis or {}  # per node i: another Redis URL (a proxy, ...)
        self.echo = echo
        self.nodes: list[NodeProcess] = []

    def start(self) -> "LocalCluster":
        try:
            if self.redis is not None:
                self.redis.start()
            if self.redis_cluster is not None:
                self.redis_cluster.start()
            for i in range(self.count):
                port = self.base_port + i if self.base_port else 0
                self.nodes.append(NodeProcess(
                    "--name", f"n{i + 1}", "--port", str(port),
                    "--redis", self.node_redis.get(i, self.redis_url),
                    env={**self.env, **(self.node_env[i] if i < len(self.node_env) else {})},
                    echo=self.echo, log_file=self._log_of(f"n{i + 1}")))
            for node in self.nodes:
                node.start()
            if self.count > 1:
                for node in self.nodes:  # every node has heard every other
                    node.wait_event("node_joined", timeout=15.0, count=self.count - 1)
        except BaseException:
            self.stop()
            raise
        return self

    def _log_of(self, name: str) -> str | None:
        return os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None

    def restart(self, i: int, graceful: bool = False,
                start_timeout: float = 30.0) -> NodeProcess:
        """SIGKILL node ``i`` (``graceful``: SIGTERM, and wait for it to drain and exit) and
        start a new process under its name, port and options at once (as a process
        supervisor would); returns the new node once it serves (NodeStartError if not
        within ``start_timeout`` s)."""
        old = self.nodes[i]
        args = list(old.args)
        args[args.index("--port") + 1] = old.url.rsplit(":", 1)[1]
        if graceful:
            old.stop()
        else:
            old.kill()
        new = NodeProcess(*args, env=old.env, echo=self.echo, log_file=old.log_file)
        self.nodes[i] = new
        return new.start(start_timeout)

    def stop(self) -> dict[str, Any]:
        codes = {}
        for node in self.nodes:  # all at once: they drain side by side
            node.signal(signal.SIGTERM)
        for node in self.nodes:
            codes[node.name or "?"] = node.wait_exit()
        if self.redis is not None:
            self.redis.stop()
        if self.redis_cluster is not None:
            self.redis_cluster.stop()
        return codes
