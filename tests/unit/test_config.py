"""Configuration: the documented file is the defaults; precedence; errors name the key."""

import tomllib
from pathlib import Path

import pytest

from rpcbus.broker import config

CONF = Path(__file__).parents[2] / "conf" / "rpcbus.toml"


def test_the_shipped_file_lists_every_option_with_its_default():
    with open(CONF, "rb") as f:
        shipped = tomllib.load(f)
    assert shipped == config.Config().as_dict()


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "n.toml"
    f.write_text('[rpc]\nack_timeout = 2\n[node]\nport = 7000\nname = "file"\n')
    env = {"RPCBUS_RPC_ACK_TIMEOUT": "3.5", "RPCBUS_NODE_NAME": "env", "HOME": "/x"}
    cfg = config.load(f, env=env, overrides={"node": {"name": "flag", "port": None}})
    assert cfg.rpc.ack_timeout == 3.5
    assert cfg.node.port == 7000
    assert cfg.node.name == "flag"
    assert cfg.server.uvloop is True


def test_variables_that_name_no_section_are_not_the_nodes_to_refuse():
    """RPCBUS_URL (rpcbus call's), a tool's own RPCBUS_PROJECT: not node settings."""
    cfg = config.load(None, env={"RPCBUS_URL": "ws://x", "RPCBUS_TOKEN": "t",
                                 "RPCBUS_PROJECT": "p", "RPCBUS_NODE_NAME": "n"})
    assert cfg.node.name == "n"


@pytest.mark.parametrize("text, env, why", [
    ("[rpc]\nack_timout = 1\n", {}, r"unknown key rpc.ack_timout \(did you mean rpc.ack_timeout"),
    ("[nodes]\nport = 1\n", {}, r"unknown section \[nodes\]"),
    ('[node]\nport = "x"\n', {}, "node.port: expected an integer"),
    ("[rpc]\nack_timeout = -1\n", {}, "rpc.ack_timeout: must be positive"),
    ('[log]\nlevel = "loud"\n', {}, "log.level: must be one of"),
    ("", {"RPCBUS_LIMITS_MAX_FRAME": "1"}, "unknown key limits.max_frame"),
    ("", {"RPCBUS_RPC_ACK_TIMOUT": "1"}, "did you mean RPCBUS_RPC_ACK_TIMEOUT"),
    ("", {"RPCBUS_SERVER_UVLOOP": "perhaps"}, "server.uvloop: expected true or false"),
    ("[rpc]\nresponse_timeout = 900.0\n", {}, "must not exceed rpc.max_timeout"),
    ("[rpc\n", {}, "n.toml"),
])
def test_bad_values_are_errors_that_name_the_key(tmp_path, text, env, why):
    f = tmp_path / "n.toml"
    f.write_text(text)
    with pytest.raises(config.ConfigError, match=why):
        config.load(f, env=env)


@pytest.mark.parametrize("url,unsealed_ok", [
    ("redis://127.0.0.1:6379/0", True), ("redis://localhost/0", True),
    ("unix:///run/redis.sock", True), ("redis+cluster://127.0.0.1:7000,[::1]:7001/", True),
    ("redis://10.0.0.5:6379/0", False), ("rediss://redis.internal:6380/0", False),
    ("redis+sentinel://127.0.0.1:26379,sentinel.internal:26379/main", False),
])
def test_an_unsealed_bus_must_be_chosen_where_others_reach_redis(url, unsealed_ok):
    env = {"RPCBUS_CLUSTER_REDIS_URL": url}
    if unsealed_ok:
        assert config.load(env=env).cluster.seal == "none"
    else:
        with pytest.raises(config.ConfigError, match='cluster.seal = "none"'):
            config.load(env=env)
    assert config.load(env={**env, "RPCBUS_CLUSTER_SEAL": "none"}).cluster.seal == "none"


async def test_an_unsealed_default_judges_every_redis_the_bus_would_use(monkeypatch):
    """A Sentinel on loopback naming a master elsewhere, or a Redis Cluster whose slot map
    names a node elsewhere: the bus (unsealed because the URL was on loopback) refuses
    before connecting there. Decided from the Sentinel's answer and the slot map; no
    traffic leaves loopback (both are stood in for)."""
    from redis.asyncio.sentinel import Sentinel

    from rpcbus.cluster import resp, shards
    from rpcbus.cluster.redisconn import NotOnLoopback

    dialed = []

    async def dial(options, *args, **kwargs):
        dialed.append(options["host"])
        raise ConnectionRefusedError("the test dials nowhere")
    monkeypatch.setattr(resp, "connect_to", dial)
    monkeypatch.setattr(shards, "_connect", lambda address, *a, **k: dial(
        {"host": address[0]}))
    master = ("10.1.2.3", 6379)

    async def discover_master(self, name):
        return master
    monkeypatch.setattr(Sentinel, "discover_master", discover_master)
    sentinel = "redis+sentinel://127.0.0.1:26379/main"
    cfg = config.load(env={"RPCBUS_CLUSTER_REDIS_URL": sentinel}).cluster
    assert (cfg.seal, cfg.loopback_only) == ("none", True)
    with pytest.raises(NotOnLoopback, match=r"10\.1\.2\.3:6379 is not on loopback"):
        await shards.open_links(sentinel, ["t"], lambda c, d: None, loopback_only=True)
    assert dialed == []
    master = ("127.0.0.1", 6390)                           # after a failover: back here
    with pytest.raises(ConnectionRefusedError):
        await shards.open_links(sentinel, ["t"], lambda c, d: None, loopback_only=True)
    assert dialed == ["127.0.0.1"]
    chosen = config.load(env={"RPCBUS_CLUSTER_REDIS_URL": sentinel,
                              "RPCBUS_CLUSTER_SEAL": "none"}).cluster
    assert not chosen.loopback_only                        # an unsealed bus, chosen

    seeds = shards.Seeds("redis+cluster://127.0.0.1:7000/")

    async def slot_map(seeds, *args):
        seeds.known = [("127.0.0.1", 7000), ("10.0.0.9", 7001)]
        return shards.SlotMap.parse([[0, 8000, [b"127.0.0.1", 7000]],
                                     [8001, 16383, [b"10.0.0.9", 7001]]], ("127.0.0.1", 7000))
    monkeypatch.setattr(shards, "slot_map", slot_map)
    dialed.clear()
    with pytest.raises(NotOnLoopback, match="Redis Cluster node 10.0.0.9:7001"):
        await shards.open_links("redis+cluster://127.0.0.1:7000/", ["t"], lambda c, d: None,
                                seeds=seeds, loopback_only=True)
    assert dialed == [] and seeds.known == []              # nor asked next time
