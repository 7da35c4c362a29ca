"""Redis Cluster addressing without sockets: the slot map and the cluster URL."""

import pytest
from redis.crc import key_slot

from rpcbus.broker import config as config_mod
from rpcbus.cluster.redisconn import parse_cluster_url
from rpcbus.cluster.shards import ClusterUnavailable, SlotMap

A, B, C = ("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 7002)


def test_a_topic_goes_to_the_master_of_its_slot_wherever_the_ranges_are():
    # CLUSTER SLOTS, out of order, one master announcing no host (reached as asked)
    reply = [[10923, 16383, [b"10.0.0.3", 7002, b"id3"], [b"10.0.0.9", 7009, b"r3"]],
             [0, 5460, [b"10.0.0.1", 7000, b"id1"]],
             [5461, 10922, [b"", 7001, b"id2"]]]
    found = SlotMap.parse(reply, asked=("10.0.0.2", 7999))
    assert found.masters() == [A, B, C]
    assert ("10.0.0.9", 7009) in found.nodes          # a replica: a seed for later
    for topic in ("rpcbus:ctrl", "rpcbus:node:n1", "rpcbus:node:n2", "x{tag}y"):
        slot = key_slot(topic.encode())
        assert found.owner(topic) == (A if slot <= 5460 else B if slot <= 10922 else C)


def test_a_slot_no_master_serves_is_unavailable_not_a_guess():
    topic = "rpcbus:node:n1"
    slot = key_slot(topic.encode())
    holes = [[0, slot - 1, [b"10.0.0.1", 7000, b"id1"]],
             [slot + 1, 16383, [b"10.0.0.2", 7001, b"id2"]]]
    with pytest.raises(ClusterUnavailable, match=f"slot {slot}"):
        SlotMap.parse(holes, asked=A).owner(topic)


def test_cluster_urls_carry_seeds_credentials_and_tls_and_bad_ones_say_what_to_write():
    seeds, options, secure = parse_cluster_url("redis+cluster://bus:p%40ss@h1:7000,[::1]:7001/")
    assert (seeds, options, secure) == ([("h1", 7000), ("::1", 7001)],
                                        {"username": "bus", "password": "p@ss"}, False)
    seeds, options, secure = parse_cluster_url("rediss+cluster://h1:7000/?ssl_cert_reqs=none")
    assert secure and options["ssl_cert_reqs"] == "none"
    for bad, says in [("redis+cluster://h1/", "want host:port"),
                      ("redis+cluster://h1:7000/2", "only database 0"),
                      ("redis+clusters://h1:7000/", "want redis://")]:
        with pytest.raises(config_mod.ConfigError, match=says):
            config_mod.load(env={"RPCBUS_CLUSTER_REDIS_URL": bad})
