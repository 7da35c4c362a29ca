"""The pure parts of security: password hashes, users and globs, rate limits, batch seals."""

import base64
import json
import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus.broker import config, gate
from rpcbus.broker.auth import AuthConfigError, Users, hash_password, token_digest, verify_password
from rpcbus.broker.limits import WindowLimiter
from rpcbus.cluster.seal import START_SLACK, ReplayGuard, Sealer, SealError, new_key

FAST_HASH = dict(n=1 << 10)   # a cheap scrypt for tests; the parameters travel in the hash


def test_password_hashes_verify_only_the_right_password_and_carry_their_parameters():
    stored = hash_password("s3cret", **FAST_HASH)
    assert stored.startswith("scrypt$1024$8$1$")
    assert verify_password(stored, "s3cret")
    assert not verify_password(stored, "s3cret ")
    assert not verify_password(None, "s3cret")           # unknown user: same work, False
    assert hash_password("s3cret", **FAST_HASH) != stored  # salted
    with pytest.raises(ValueError):
        verify_password("md5$abc", "x")


def test_users_roles_and_globs_no_matching_rule_means_denied():
    users = Users({
        "alice": {"password": hash_password("a", **FAST_HASH), "roles": ["billing"],
                  "call": ["audit.read"]},
        "bot": {"token_sha256": token_digest("tok-1"), "call": ["*"]},
    }, {"billing": {"provide": ["billing.*"], "call": ["billing.*", "users.get"]}})
    alice = users.by_name["alice"].permissions
    assert alice.may_provide("billing.charge") and alice.may_provide("billing.a.b")
    assert not alice.may_provide("users.get") and not alice.may_provide("billing")
    assert alice.may_call("users.get") and alice.may_call("audit.read")
    assert not alice.may_call("audit.write") and not alice.may_call("Billing.charge")
    assert users.by_token_value("tok-1").name == "bot"
    assert users.by_token_value("tok-2") is None
    bot = users.by_token_value("tok-1").permissions
    assert bot.may_call("anything.at.all") and not bot.may_provide("x")


@pytest.mark.parametrize("users, roles, needle", [
    ({"a": {}}, {}, "auth.users.a: needs a password, a token_sha256 or a token_sub"),
    ({"a": {"token_sub": 5}}, {}, "auth.users.a.token_sub"),
    ({"a": {"token_sub": "s"}, "b": {"token_sub": "s"}}, {}, "'s' is already auth.users.a's"),
    ({"a": {"token_sha256": "00", "call": ["*"]}}, {}, "auth.users.a.token_sha256"),
    ({"a": {"token_sha256": "0" * 64, "roles": ["x"]}}, {}, "no role 'x'"),
    ({"a": {"token_sha256": "0" * 64, "call": "*"}}, {}, "auth.users.a.call"),
    ({"a": {"token_sha256": "0" * 64, "colour": 1}}, {}, "unknown key colour"),
    ({"a": {"password": "plain"}}, {}, "auth.users.a.password"),
    ({}, {"r": {"call": ["*"], "other": []}}, "auth.roles.r"),
])
def test_bad_users_and_roles_are_named(users, roles, needle):
    with pytest.raises(AuthConfigError, match=needle.replace(".", r"\.").replace("'", ".")):
        Users(users, roles)


def test_config_checks_users_keys_and_tls_at_load(tmp_path):
    f = tmp_path / "n.toml"
    f.write_text('[auth]\nmode = "users"\n')
    with pytest.raises(config.ConfigError, match="none. explicitly"):
        config.check_serving(config.load(f, env={}))               # no users: no node
    config.check_serving(config.load(f, env={"RPCBUS_AUTH_MODE": "none"}))
    f.write_text('[auth.users.a]\ntoken_sha256 = "x"\n')
    with pytest.raises(config.ConfigError, match="token_sha256"):
        config.load(f, env={})
    env = {"RPCBUS_CLUSTER_SEAL": "sign", "RPCBUS_CLUSTER_KEY_ID": "k1",
           "RPCBUS_CLUSTER_KEYS": '{"k1": "%s"}' % new_key()}
    assert config.load(None, env=env).cluster.keys["k1"]
    with pytest.raises(config.ConfigError, match="not among the keys"):
        config.load(None, env={**env, "RPCBUS_CLUSTER_KEY_ID": "k9"})
    with pytest.raises(config.ConfigError, match="32 bytes"):
        config.load(None, env={**env, "RPCBUS_CLUSTER_KEYS": '{"k1": "YWJj"}'})
    with pytest.raises(config.ConfigError, match="tls_key"):
        config.load(None, env={"RPCBUS_SERVER_TLS_CERT": "/x.pem"})


def test_a_jwt_sub_is_a_file_user_only_where_that_user_names_it():
    from rpcbus.broker.tokens import Grant
    users = Users({"app": {"token_sha256": token_digest("t"), "call": ["a.*"]},
                   "alice": {"token_sub": "svc-7", "max_connections": 2}}, {})

    def grant(sub):
        return users.granted(Grant(sub, 0.0, "kid", "rpcbus", "rpcbus", {"call": ["b.*"]}))

    same_name = grant("app")                              # not mapped: its own identity
    assert (same_name.name, same_name.key) == ("app", "token:app")
    mapped = grant("svc-7")                               # alice's token_sub: alice
    assert (mapped.name, mapped.key) == ("alice", "alice")
    assert mapped.permissions.may_call("b.x") and not mapped.permissions.may_call("a.x")
    g = gate.Gate(config.load(env={"RPCBUS_AUTH_USERS": json.dumps(
        {"alice": {"token_sub": "svc-9"}})}))
    g.tokens.holds = lambda grant: ""               # its key and issuer still stand
    assert g.now_for(mapped, None) is None          # a reload took alice's token_sub away
    assert g.now_for(same_name, None).key == "token:app"


def test_fixed_window_refuses_over_the_limit_then_starts_over():
    lim = WindowLimiter(1.0, max_messages=3, max_bytes=0)
    assert [lim.take(0.0) for _ in range(5)] == [True, True, True, False, False]
    assert lim.refused == 2 and lim.first_refusal_in_window() and not lim.first_refusal_in_window()
    assert lim.take(1.0)                                      # a new window
    by_bytes = WindowLimiter(1.0, max_messages=0, max_bytes=100)
    by_bytes.received(0.0, 60)
    assert by_bytes.take(0.0)
    by_bytes.received(0.1, 60)
    assert not by_bytes.take(0.1)
    by_bytes.received(1.2, 10)
    assert by_bytes.take(1.2)


def sealer(mode="sign", keys=None, key_id="k1", skew=30.0):
    return Sealer(mode, keys or {"k1": KEY1}, key_id, skew)


KEY1, KEY2 = new_key(), new_key()


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
def test_seal_opens_only_with_the_key_the_mode_and_the_topic(mode):
    a = sealer(mode)
    sealed = a.seal("ns:node:n2", b"batch")
    assert a.open("ns:node:n2", sealed)[0] == b"batch"
    if mode == "encrypt":
        assert b"batch" not in sealed
    with pytest.raises(SealError, match="bad_seal"):
        a.open("ns:node:n3", sealed)                          # replayed to another node
    with pytest.raises(SealError, match="bad_seal"):
        sealer(mode, {"k1": KEY2}).open("ns:node:n2", sealed)  # same id, other key
    with pytest.raises(SealError, match="unknown_key"):
        sealer(mode, {"k2": KEY2}, "k2").open("ns:node:n2", sealed)
    with pytest.raises(SealError, match="wrong_mode"):
        sealer("encrypt" if mode == "sign" else "sign").open("ns:node:n2", sealed)
    with pytest.raises(SealError, match="unsealed"):
        a.open("ns:node:n2", b"batch")


def test_rotation_accepts_every_configured_key_and_skew_is_enforced():
    old, new = sealer(keys={"k1": KEY1}), sealer(keys={"k1": KEY1, "k2": KEY2}, key_id="k2")
    assert new.open("t", old.seal("t", b"x"))[0] == b"x"
    obj = msgpack.unpackb(new.seal("t", b"x"))
    assert obj[2] == "k2"
    with pytest.raises(SealError, match="unknown_key"):
        old.open("t", new.seal("t", b"x"))
    strict = sealer(skew=0.5)
    sealed = strict.seal("t", b"x")
    obj = msgpack.unpackb(sealed)
    obj[3] -= 60_000                                          # stamped a minute ago
    with pytest.raises(SealError):                            # the stamp is sealed too
        strict.open("t", msgpack.packb(obj))
    late = Sealer("sign", {"k1": KEY1}, "k1", 0.5)
    late_batch = late.seal("t", b"x")
    real_time = time.time_ns
    try:
        time.time_ns = lambda: real_time() + 2_000_000_000  # the receiver's clock: 2 s later
        with pytest.raises(SealError, match="skew"):
            strict.open("t", late_batch)
    finally:
        time.time_ns = real_time


def test_replays_are_refused_and_reordering_within_the_window_is_not():
    guard = ReplayGuard(30.0)
    assert guard.fresh("n1", 100, 0.0)
    assert not guard.fresh("n1", 100, 0.0)
    assert guard.fresh("n1", 103, 0.0) and guard.fresh("n1", 101, 0.0)   # out of order
    assert not guard.fresh("n1", 101, 0.0) and not guard.fresh("n1", 103, 0.0)
    assert guard.fresh("n1", 102, 0.0)
    assert guard.fresh("n1", 10_000, 0.0)
    assert not guard.fresh("n1", 104, 0.0)                   # older than the window
    assert guard.fresh("n2", 100, 0.0)                       # per sender


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_payloads_never_open(raw):
    with pytest.raises(SealError):
        sealer().open("t", raw)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["sign", "encrypt"]), st.data())
def test_any_changed_byte_is_refused_or_opens_to_the_same_batch(mode, data):
    s = sealer(mode)
    sealed = bytearray(s.seal("t", msgpack.packb(["n1", 1.0, [[21, 5]]])))
    i = data.draw(st.integers(0, len(sealed) - 1))
    sealed[i] ^= data.draw(st.integers(1, 255))
    try:
        batch, _ = s.open("t", bytes(sealed))
    except SealError:
        return
    assert msgpack.unpackb(batch) == ["n1", 1.0, [[21, 5]]]


def test_keys_are_32_random_bytes():
    assert len(base64.b64decode(new_key())) == 32 and new_key() != new_key()


def test_a_receiver_refuses_batches_sealed_before_it_started():
    sender = sealer()
    old = sender.seal("t", b"x")                               # sealed now
    real_time = time.time_ns
    try:
        time.time_ns = lambda: real_time() + int((START_SLACK + 1) * 1e9)
        restarted = sealer()                                   # a receiver started later
        with pytest.raises(SealError, match="before_start"):
            restarted.open("t", old)                           # within max_skew, but older
        assert restarted.open("t", sender.seal("t", b"y"))[0] == b"y"   # sealed after it
    finally:
        time.time_ns = real_time


def _pem(key, private=False):
    from cryptography.hazmat.primitives import serialization as ser
    if private:
        return key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8,
                                 ser.NoEncryption())
    return key.public_key().public_bytes(ser.Encoding.PEM,
                                         ser.PublicFormat.SubjectPublicKeyInfo)


def test_token_keys_are_checked_at_load_and_a_token_is_judged_by_the_clock_given(tmp_path):
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    from rpcbus.broker.tokens import TokenError, Tokens, load_keys

    signer = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "k.pub").write_bytes(_pem(signer))
    (tmp_path / "k.key").write_bytes(_pem(signer, private=True))
    (tmp_path / "weak.pub").write_bytes(_pem(rsa.generate_private_key(65537, 1024)))
    for keys, needle in [({"k": str(tmp_path / "k.key")}, "that is a private key"),
                         ({"k": str(tmp_path / "none.pub")}, "No such file"),
                         ({"k": str(tmp_path / "weak.pub")}, "1024 bits: 2048 at least"),
                         ({"k": str(tmp_path / "k.pub"), "again": str(tmp_path / "k.pub")},
                          "the same key as auth.token_keys.k")]:
        with pytest.raises(config.ConfigError, match=needle):
            config.load(None, env={"RPCBUS_AUTH_TOKEN_KEYS": json.dumps(keys)})
    only_tokens = config.load(None, env={
        "RPCBUS_AUTH_TOKEN_KEYS": json.dumps({"k": str(tmp_path / "k.pub")})})
    config.check_serving(only_tokens)                        # a token key is enough to serve

    tokens = Tokens(load_keys({"k": str(tmp_path / "k.pub")}), leeway=5)
    token = jwt.encode({"sub": "app", "exp": 1000, "nbf": 500, "iss": "rpcbus",
                        "aud": ["other", "rpcbus"], "call": ["a.*"], "roles": ["ops"]},
                       signer, algorithm="EdDSA")
    grant = tokens.verify(token, now=1004.9)                 # within the leeway
    assert (grant.user, grant.expires, grant.claims["call"]) == ("app", 1005.0, ["a.*"])
    assert Users({}, {"ops": {"call": ["ops.*"]}}).granted(grant).permissions.call == \
        ("a.*", "ops.*")
    with pytest.raises(TokenError, match="expired at 1970-01-01T00:16:40Z"):
        tokens.verify(token, now=1005.1)
    with pytest.raises(TokenError, match="not valid before"):
        tokens.verify(token, now=494)
    forever = jwt.encode({"sub": "app", "exp": 1e308, "iss": "rpcbus", "aud": "rpcbus"},
                         signer, algorithm="EdDSA")
    with pytest.raises(TokenError, match="lives too long.*auth.token_max_ttl"):
        tokens.verify(forever, now=1000)                     # at most a day, by default
    day = jwt.encode({"sub": "app", "exp": 1000 + 86_400, "iss": "rpcbus", "aud": "rpcbus"},
                     signer, algorithm="EdDSA")
    assert tokens.verify(day, now=1000).user == "app"
    with pytest.raises(TokenError, match="lives too long"):
        Tokens(tokens.keys, max_ttl=3600).verify(day, now=1000)
    assert tokens.holds(grant) == ""
    assert "audience" in Tokens(tokens.keys, audience="mine").holds(grant)
    assert "removed" in Tokens({}).holds(grant)


def test_the_sdk_renews_a_jwt_a_minute_before_exp_or_a_fifth_of_its_life():
    from rpcbus.credentials import RENEW_BEFORE, jwt_times, renew_in

    def unsigned(claims):
        body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        return f"eyJhbGciOiJFZERTQSJ9.{body}.sig"
    now = 1_000_000.0
    assert renew_in(unsigned({"iat": now, "exp": now + 3600}), now) == 3600 - RENEW_BEFORE
    assert renew_in(unsigned({"iat": now, "exp": now + 10}), now) == 8.0
    assert renew_in(unsigned({"exp": now - 5}), now) == 0.0        # expired: at once
    assert renew_in("static-token", now) is None
    assert jwt_times(unsigned({"sub": "x", "exp": True})) is None


def test_forged_batches_spend_their_channels_budget_then_large_ones_go_unopened():
    """The bus's reader (cluster/bus.py ``_deliver``, fed as the connection would): bad
    seals are opened until the budget of failed opens is spent (here the node's and the
    channel's at once); then large batches are dropped unopened and counted, small ones
    (heartbeats, answers) still opened and handed on."""
    from rpcbus.cluster import bus as bus_module
    from rpcbus.cluster.budget import CheckBudget
    from rpcbus.cluster.messages import encode_batch

    got = []
    bus = bus_module.Bus("redis://127.0.0.1:1", "ns", "n2", 7, lambda b, now: got.append(b),
                         lambda: None, lambda why: None, sealer=sealer())
    bus._opens = CheckBudget(share=1e-6, burst=2e-6)     # spent by the first failure
    sender = sealer()
    topic, other = "ns:node:n2", "ns:control"

    def genuine(topic, size, name):   # a batch of ``size`` bytes from node ``name``
        return sender.seal(topic, encode_batch(name, 1, 0, time.time(), [[b"x" * size]]))

    forged = msgpack.packb([1, 1, "k1", time.time_ns() // 1_000_000, 1,
                            bytes(128 << 10), b"\0" * 32])
    for _ in range(5):
        bus._deliver(topic.encode(), forged)
    assert bus.rejected == {"bad_seal": 1, "over_budget": 4}
    bus._deliver(topic.encode(), genuine(topic, 1_000, "small"))      # opened
    bus._deliver(topic.encode(), genuine(topic, 64 << 10, "large"))   # unopened
    bus._deliver(other.encode(), genuine(other, 1_000, "other"))      # another channel's
    assert [b.sender for b in got] == ["small", "other"]
    assert bus.rejected == {"bad_seal": 1, "over_budget": 5}
