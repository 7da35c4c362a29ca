"""JWT tokens (broker/tokens.py) against a real node process: the nodes hold only public
keys; a token's claims are its user's rights; rights end when it expires; keys rotate
by reload. Keys and most tokens come from the ``rpcbus token`` commands, the hostile
ones from PyJWT directly."""

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

import rpcbus
from rpcbus import protocol as p
from rpcbus.broker.auth import token_digest
from rpcbus.broker.process import NodeProcess
from rpcbus.broker.tokens import MAX_TOKEN, fingerprint

from ..timing import wait
from .raw import RawPeer

ADMIN = "admin-token-for-reload"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rpcbus.broker", *args],
                          capture_output=True, text=True, timeout=60)


def keygen(tmp_path: Path, name: str, kind: str = "ed25519") -> Path:
    out = tmp_path / name
    made = cli("token", "keygen", "--out", str(out), "--type", kind)
    assert made.returncode == 0, made.stderr
    return out


def write_config(tmp_path: Path, keys: dict[str, Path]) -> Path:
    path = tmp_path / "node.toml"
    path.write_text("\n".join([
        "[server]", f'admin_token_sha256 = "{token_digest(ADMIN)}"',
        "[auth]", "token_leeway = 0",
        "[auth.roles.ops]", 'call = ["ops.*"]',
        "[auth.token_keys]", *(f'{label} = "{key}.pub"' for label, key in keys.items())]))
    return path


def issue(key: Path, user: str, *args: str) -> str:
    made = cli("token", "issue", "--key", str(key), "--user", user, *args)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def private(key: Path):
    return serialization.load_pem_private_key(key.read_bytes(), password=None)


def sign(key: Path, alg: str = "EdDSA", kid: bool = True, **claims) -> str:
    body = {"sub": "app", "iss": "rpcbus", "aud": "rpcbus", "exp": time.time() + 600,
            **claims}
    body = {k: v for k, v in body.items() if v is not None}
    signer = private(key)
    headers = {"kid": fingerprint(signer.public_key())} if kid else {}
    return jwt.encode(body, signer, algorithm=alg, headers=headers)


def admin_stats(node: NodeProcess) -> dict:
    req = urllib.request.Request(node.url.replace("ws://", "http://") + "/stats",
                                 headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def reload_cli(url: str) -> subprocess.CompletedProcess[str]:
    return cli("reload", "--node", url, "--admin-token", ADMIN)


@pytest.fixture
def keys(tmp_path):
    return {"a": keygen(tmp_path, "a.key"), "b": keygen(tmp_path, "b.key", "p256")}


@pytest.fixture
def node(tmp_path, keys):
    node = NodeProcess("--config", str(write_config(tmp_path, keys))).start()
    yield node
    node.stop()


async def test_a_token_user_calls_and_provides_within_its_claims_only(node, keys):
    svc_token = issue(keys["a"], "svc", "--provide", "pub.*", "--publish", "feed.*")
    app_token = issue(keys["a"], "app", "--call", "pub.*", "--role", "ops", "--ttl", "10m")
    async with rpcbus.connect(node.url, token=svc_token) as svc, \
            rpcbus.connect(node.url, token=app_token) as app:
        await svc.provide("pub.whoami", lambda d, ctx: ctx.user)
        assert await app.call("pub.whoami", None) == "app"   # the token's sub
        with pytest.raises(rpcbus.PermissionDeniedError, match="may not call 'priv.x'"):
            await app.call("priv.x", 1)
        with pytest.raises(rpcbus.NoProviderError):            # the role's ops.*: allowed
            await app.call("ops.status", 1, timeout=2)
        with pytest.raises(rpcbus.PermissionDeniedError, match="may not provide"):
            await app.provide("pub.mine", lambda d: d)
        with pytest.raises(rpcbus.PermissionDeniedError):      # svc has no call claim
            await svc.call("pub.whoami", 1)
    # event topics: --publish and --subscribe claims
    reader = issue(keys["a"], "reader", "--subscribe", "feed.*")
    async with rpcbus.connect(node.url, token=svc_token) as svc, \
            rpcbus.connect(node.url, token=reader) as sub:
        got = asyncio.Queue()
        await sub.subscribe("feed.a", got.put_nowait)
        with pytest.raises(rpcbus.PermissionDeniedError, match="subscribe to pub.x"):
            await svc.subscribe("pub.x", got.put_nowait)
        await sub.emit("feed.a", "not allowed")               # reader may not publish
        await svc.emit("feed.a", "news")
        async with asyncio.timeout(wait(5)):
            assert await got.get() == "news"
        await sub.ping()   # its own emit, read before this PING, reached nobody
        assert got.empty()
    # a P-256 key, and a token without a kid: each key whose algorithm it names is tried
    async with rpcbus.connect(node.url, token=sign(keys["b"], "ES256", kid=False,
                                                   call=["pub.*"])) as other:
        with pytest.raises(rpcbus.NoProviderError):
            await other.call("pub.whoami", 1, timeout=2)


async def test_bad_tokens_are_each_refused_with_one_clear_reason(node, keys, tmp_path):
    stranger = keygen(tmp_path, "stranger.key")
    public_pem = (Path(f"{keys['a']}.pub")).read_bytes()
    a_kid = fingerprint(private(keys["a"]).public_key())
    forged = sign(stranger).split(".")
    forged[0] = sign(keys["a"]).split(".")[0]                  # a's kid, stranger's signature
    none_alg = jwt.encode({"sub": "app", "exp": time.time() + 60, "iss": "rpcbus",
                           "aud": "rpcbus"}, None, algorithm="none")
    cases = {
        "signed by a key this node does not hold": sign(stranger),
        "signature does not verify": ".".join(forged),
        "algorithm none is not accepted": none_alg,
        "algorithm 'HS256' is not accepted": jwt.encode(  # the public key as an HMAC secret
            {"sub": "app", "exp": time.time() + 60}, public_pem.decode()[:40],
            algorithm="HS256", headers={"kid": a_kid}),
        "audience is not 'rpcbus'": sign(keys["a"], aud="elsewhere"),
        "issuer is not 'rpcbus'": sign(keys["a"], iss="someone"),
        "token expired at": sign(keys["a"], exp=time.time() - 5),
        "token has no exp claim": sign(keys["a"], exp=None),
        "token not valid before": sign(keys["a"], nbf=time.time() + 3600),
        "token claim call": sign(keys["a"], call="pub.*"),
        "token malformed": "eyJhbGciOiJFZERTQSJ9.not-json.x",
        "token too long": sign(keys["a"], call=["x" * 200] * (MAX_TOKEN // 150)),
    }
    for reason, token in cases.items():
        with pytest.raises(rpcbus.NotAuthenticatedError, match=reason):
            await rpcbus.connect(node.url, token=token, reconnect=False)
    # and the node serves as before
    async with rpcbus.connect(node.url, token=sign(keys["a"], call=["pub.*"],
                                                   provide=["pub.*"])) as ok:
        await ok.provide("pub.echo", lambda d: d)
        assert await ok.call("pub.echo", 5) == 5


async def test_rights_end_when_the_token_expires_but_calls_in_flight_finish(node, keys):
    soon = time.time() + 3
    release = asyncio.Event()

    async def slow(d):
        await release.wait()
        return d
    async with rpcbus.connect(node.url, token=sign(keys["a"], sub="svc",
                                                   provide=["pub.*"])) as svc, \
            rpcbus.connect(node.url, token=sign(keys["a"], sub="brief", exp=soon,
                                                provide=["pub.*"])) as brief, \
            rpcbus.connect(node.url, token=sign(keys["a"], exp=soon,
                                                call=["pub.*"])) as app, \
            rpcbus.connect(node.url, token=sign(keys["a"], sub="long",
                                                call=["pub.*"])) as other:
        await svc.provide("pub.slow", slow)
        await svc.provide("pub.echo", lambda d: d)
        await brief.provide("pub.brief", lambda d: -d)
        assert await other.call("pub.brief", 1) == -1
        in_flight = asyncio.ensure_future(app.call("pub.slow", 7, timeout=20))
        await asyncio.to_thread(node.wait_event, "session_token_expired", 20, 2)
        with pytest.raises(rpcbus.NotAuthenticatedError, match="has expired"):
            await app.call("pub.echo", 1)
        with pytest.raises(rpcbus.NoProviderError):     # brief's names were withdrawn
            await other.call("pub.brief", 1, timeout=2)
        release.set()
        assert await in_flight == 7                     # the call it made before finished
        assert await other.call("pub.echo", 2) == 2     # the others keep their rights


async def test_keys_rotate_by_reload(node, keys, tmp_path):
    new = keygen(tmp_path, "new.key")
    write_config(tmp_path, {**keys, "new": new})
    assert reload_cli(node.url).returncode == 0
    rights = dict(call=["pub.*"], provide=["pub.*"])
    async with rpcbus.connect(node.url, token=sign(keys["a"], **rights)) as old_one, \
            rpcbus.connect(node.url, token=sign(new, sub="fresh", **rights)) as new_one:
        await new_one.provide("pub.echo", lambda d: d)
        assert await old_one.call("pub.echo", 1) == 1   # both keys valid

        # a key file that cannot be read: the reload is refused, nothing changes
        write_config(tmp_path, {"new": new, "gone": tmp_path / "missing.key"})
        refused = reload_cli(node.url)
        assert refused.returncode == 1 and "missing.key.pub" in refused.stderr
        assert await old_one.call("pub.echo", 2) == 2

        write_config(tmp_path, {"new": new})            # the old keys removed
        assert reload_cli(node.url).returncode == 0
        with pytest.raises(rpcbus.PermissionDeniedError):
            await old_one.call("pub.echo", 3)            # its token's key is gone
        assert await new_one.call("pub.echo", 4) == 4
        with pytest.raises(rpcbus.NotAuthenticatedError, match="does not hold"):
            await rpcbus.connect(node.url, token=sign(keys["a"], **rights), reconnect=False)


async def test_a_token_function_renews_the_session_on_the_same_connection(node, keys):
    """A token function: called at login and before the JWT expires. Here its first
    renewal brings a token of another user (refused: nothing changes), so the session's
    token expires; the SDK renews at once on the node's notice and provides again."""
    tokens = [sign(keys["a"], sub="svc", exp=time.time() + 3, provide=["pub.*"]),
              sign(keys["a"], sub="intruder", provide=["*"]),
              sign(keys["a"], sub="svc", provide=["pub.*"])]
    fetched = []

    async def token():
        fetched.append(tokens[len(fetched)] if len(fetched) < len(tokens) else tokens[-1])
        return fetched[-1]
    async with rpcbus.connect(node.url, token=token) as svc, \
            rpcbus.connect(node.url, token=sign(keys["a"], sub="caller",
                                                call=["pub.*"])) as caller:
        session = svc.session["session"]
        await svc.provide("pub.echo", lambda d: d)
        assert await caller.call("pub.echo", 1) == 1
        refused = await asyncio.to_thread(node.wait_event, "token_renewal_refused", 20)
        assert "for user 'intruder'" in refused["reason"]
        await asyncio.to_thread(node.wait_event, "session_token_expired", 20)
        renewed = await asyncio.to_thread(node.wait_event, "session_token_renewed", 20)
        assert renewed["session"] == session and renewed["after_expiry"] is True
        for _ in range(50):       # provided again once the renewal's AUTH_OK came
            try:
                assert await caller.call("pub.echo", 2, timeout=2) == 2
                break
            except rpcbus.NoProviderError:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the renewed session never provided pub.echo again")
        assert svc.session["session"] == session      # the same connection throughout


async def test_a_tokens_sub_is_not_the_file_user_of_that_name(tmp_path, keys):
    """A file user ``app`` allowed one connection, and a token for ``sub: app``: each has
    its own connection count (and rate limiter): the token does not use up the file
    user's connection."""
    path = write_config(tmp_path, keys)
    path.write_text(path.read_text() + "\n" + "\n".join([
        "[auth.users.app]", f'token_sha256 = "{token_digest("file-app-token")}"',
        'call = ["pub.*"]', "max_connections = 1"]))
    node = NodeProcess("--config", str(path)).start()
    try:
        async with rpcbus.connect(node.url, token=sign(keys["a"], call=["pub.*"])), \
                rpcbus.connect(node.url, token="file-app-token") as file_user:
            with pytest.raises(rpcbus.NoProviderError):
                await file_user.call("pub.x", 1, timeout=2)
            with pytest.raises(rpcbus.RpcError, match="has its 1 connections"):
                await rpcbus.connect(node.url, token="file-app-token", reconnect=False)
    finally:
        node.stop()


async def test_a_flood_of_bad_jwts_from_one_address_is_refused_cheaply(node, keys, tmp_path):
    """48 connections from 127.0.0.8 send bad JWTs, each new, then the same one over and
    over: the refusals come later the more the address failed, a replayed token is
    refused from memory, and a token user from another address logs in and calls
    meanwhile (the CPU budget of failing checks: tests/unit/test_gate.py)."""
    stranger = private(keygen(tmp_path, "stranger.key"))
    made = iter(range(1 << 20))

    def new_bad():
        return jwt.encode({"sub": "mallory", "iss": "rpcbus", "aud": "rpcbus",
                           "exp": time.time() + 600, "call": ["x" * 5000, str(next(made))]},
                          stranger, algorithm="EdDSA")
    replayed = new_bad()
    answers = Counter()
    stop = asyncio.Event()

    async def attacker(token):
        while not stop.is_set():
            try:
                peer = await RawPeer.open(node.url, auth=False, local_addr=("127.0.0.8", 0))
                while not stop.is_set():
                    await peer.send([p.AUTH, {"protocol": 1, "token": token()}])
                    answers[(await peer.expect(p.AUTH_FAIL, timeout=20))[1]] += 1
            except Exception:  # closed after auth.max_failures: come back
                await asyncio.sleep(0.01)

    rights = dict(call=["pub.*"], provide=["pub.*"])
    for token in (new_bad, lambda: replayed):
        attackers = [asyncio.create_task(attacker(token)) for _ in range(48)]
        try:
            start = sum(answers.values())
            while sum(answers.values()) < start + (100 if token is new_bad else 300):
                await asyncio.sleep(0.05)
            async with asyncio.timeout(wait(5)), rpcbus.connect(
                    node.url, token=sign(keys["a"], **rights), reconnect=False) as app:
                await app.provide("pub.echo", lambda d: d)
                assert await app.call("pub.echo", 1) == 1
        finally:
            stop.set()
            await asyncio.gather(*attackers)
            stop.clear()
    auth = (await asyncio.to_thread(admin_stats, node))["auth"]
    # the replay was looked up, not verified again
    assert auth["token_checks_failed"] < sum(answers.values()) - 250
    assert auth["token_refusals_remembered"] > 250
