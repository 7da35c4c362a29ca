"""Who may connect, provide and call, through real connections to a node with users,
roles, rate limits and TLS from a config file."""

import asyncio
import datetime
import ipaddress
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.exceptions import ConnectionClosed

import rpcbus
from rpcbus import protocol as p
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.broker.process import NodeProcess

from ..timing import wait
from .conftest import FAST, stats
from .raw import RawPeer

CONFIG = """
[auth]
mode = "users"
max_failures = 3

[auth.roles.billing]
provide = ["billing.*"]
call = ["billing.*"]

[auth.roles.press]
publish = ["news.*"]
subscribe = ["news.*"]
presence = ["front*"]

[auth.users.worker]
password = "{worker_hash}"
roles = ["billing"]

[auth.users.frontend]
token_sha256 = "{frontend_digest}"
call = ["billing.*", "echo"]
subscribe = ["news.sports"]
max_connections = 2

[auth.users.newsroom]
token_sha256 = "{newsroom_digest}"
roles = ["press"]

[auth.users.chatty]
token_sha256 = "{chatty_digest}"
call = ["*"]
provide = ["echo"]
rate_messages = 20

[limits]
rate_window = 0.5
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A node with the users above (scrypt at a cheap cost: the parameters are in the hash)."""
    conf = tmp_path_factory.mktemp("sec") / "node.toml"
    conf.write_text(CONFIG.format(worker_hash=hash_password("w0rker", n=1 << 12),
                                  frontend_digest=token_digest("front-token"),
                                  chatty_digest=token_digest("chatty-token"),
                                  newsroom_digest=token_digest("newsroom-token")))
    proc = NodeProcess("--config", str(conf), env=FAST).start()
    yield proc
    assert proc.stop() == 0, list(proc.lines)[-20:]


async def test_password_and_token_logins_and_what_each_user_may_do(secured):
    async with rpcbus.connect(secured.url, user="worker", password="w0rker") as worker, \
            rpcbus.connect(secured.url, token="front-token") as front:
        assert worker.session["user"] == "worker" and front.session["user"] == "frontend"
        await worker.provide("billing.charge", lambda d: {"charged": d})
        with pytest.raises(rpcbus.PermissionDeniedError, match="users.delete"):
            await worker.provide("users.delete", lambda d: d)
        assert await front.call("billing.charge", 5, timeout=5) == {"charged": 5}
        with pytest.raises(rpcbus.PermissionDeniedError):
            await front.call("admin.reset", timeout=5)             # no rule matches
        with pytest.raises(rpcbus.PermissionDeniedError):
            await worker.call("echo", timeout=5)                   # worker: billing.* only
        assert await front.call("billing.charge", 6, timeout=5) == {"charged": 6}  # still open


async def test_who_may_publish_and_subscribe_to_which_topics(secured):
    """``publish`` and ``subscribe`` globs, own and from roles, as for calls: a SUBSCRIBE
    with one topic refused subscribes to none, a refused EMIT reaches nobody."""
    got = asyncio.Queue()
    async with rpcbus.connect(secured.url, token="newsroom-token") as press, \
            rpcbus.connect(secured.url, token="front-token") as front, \
            rpcbus.connect(secured.url, user="worker", password="w0rker") as worker:
        await front.subscribe("news.sports", got.put_nowait)
        await press.subscribe("news.sports", got.put_nowait)   # from its role
        with pytest.raises(rpcbus.PermissionDeniedError, match="news.politics"):
            await front.subscribe("news.politics", got.put_nowait)
        with pytest.raises(rpcbus.PermissionDeniedError):
            await worker.subscribe("news.sports", got.put_nowait)   # no rule for topics

        peer = await RawPeer.open(secured.url, token="front-token")
        await peer.send([p.SUBSCRIBE, 7, ["news.sports", "news.x"]])
        error = await peer.expect(p.ERROR)
        assert error[1:3] == [7, "PERMISSION_DENIED"] and "news.x" in error[3]
        await peer.send([p.EMIT, "news.sports", "from a reader"])
        error = await peer.expect(p.ERROR)
        assert error[1:3] == [None, "PERMISSION_DENIED"] and "publish" in error[3]

        await front.emit("news.sports", "from a reader too")   # refused: reaches nobody
        await press.emit("news.sports", "goal")
        assert [await got.get(), await got.get()] == ["goal", "goal"]
        await peer.send([p.PING, 1])
        before_pong = []
        while (msg := await peer.recv())[0] != p.PONG:
            before_pong.append(msg)
        assert before_pong == []                                # it subscribed to nothing
        await peer.close()
        assert got.empty()


async def test_who_may_see_whose_presence(secured):
    """``presence`` globs: a user sees the presence of the users they match, no more."""
    async with rpcbus.connect(secured.url, token="newsroom-token") as press, \
            rpcbus.connect(secured.url, token="front-token") as front:
        async with asyncio.timeout(wait(5)):
            while "frontend" not in await press.presence():
                await asyncio.sleep(0.02)
        assert await press.presence() == ["frontend"]      # not itself: "newsroom"
        assert await press.presence(["frontend"]) == {"frontend": True}
        with pytest.raises(rpcbus.PermissionDeniedError, match="newsroom"):
            await press.presence(["newsroom"])
        assert await front.presence() == []                 # no presence globs: nobody
        with pytest.raises(rpcbus.PermissionDeniedError):
            await front.watch_presence(lambda u, o: None, ["newsroom"])


async def test_discovery_shows_a_user_only_what_it_may_call(secured):
    async with rpcbus.connect(secured.url, user="worker", password="w0rker") as worker, \
            rpcbus.connect(secured.url, token="chatty-token") as chatty, \
            rpcbus.connect(secured.url, token="front-token") as front:
        await worker.provide("billing.refund", lambda d: d)
        await chatty.provide("echo", lambda d: d)
        names = {r["rpc"] for r in await front.rpcs()}     # billing.*, echo
        assert {"billing.refund", "echo"} <= names
        assert {r["rpc"] for r in await worker.rpcs()} == names - {"echo"}  # billing.* only
        [refund] = await worker.providers("billing.refund")
        assert refund["provider"].startswith("worker") and refund["node"]
        with pytest.raises(rpcbus.PermissionDeniedError, match="echo"):
            await worker.providers("echo")


@pytest.mark.parametrize("creds", [
    dict(user="worker", password="wrong"), dict(user="nobody", password="w0rker"),
    dict(token="not-a-token"), dict()])
async def test_bad_credentials_are_refused(secured, creds):
    with pytest.raises(rpcbus.NotAuthenticatedError):
        await rpcbus.connect(secured.url, reconnect=False, **creds)


async def test_failed_auth_attempts_are_limited_and_nothing_works_before_auth(secured):
    raw = await RawPeer.open(secured.url, auth=False)
    await raw.send([p.REQUEST, 1, "billing.charge", 1, None])
    assert (await raw.expect(p.ERROR))[1:3] == [1, "NOT_AUTHENTICATED"]
    for _ in range(3):
        await raw.send([p.AUTH, {"protocol": 1, "user": "worker", "password": "guess"}])
        assert (await raw.expect(p.AUTH_FAIL))[1] == "NOT_AUTHENTICATED"
    with pytest.raises(ConnectionClosed) as closed:
        await raw.recv()
    assert closed.value.rcvd.code == 1008
    assert stats(secured)["auth"]["closed_after_auth_failures"] >= 1


async def test_connections_per_user_are_capped(secured):
    async with rpcbus.connect(secured.url, token="front-token"), \
            rpcbus.connect(secured.url, token="front-token"):
        with pytest.raises(rpcbus.RateLimitedError, match="2 connections"):
            await rpcbus.connect(secured.url, token="front-token", reconnect=False)
    async with rpcbus.connect(secured.url, token="front-token") as again:  # slots freed
        await again.ping()


async def test_over_the_rate_limit_requests_are_refused_and_the_connection_stays(secured):
    async with rpcbus.connect(secured.url, token="chatty-token") as chatty, \
            rpcbus.connect(secured.url, token="front-token") as front:
        await chatty.provide("echo", lambda d: d)
        results = await asyncio.gather(*(chatty.call("echo", i, timeout=5) for i in range(60)),
                                       return_exceptions=True)
        ok = [r for r in results if not isinstance(r, Exception)]
        limited = [r for r in results if isinstance(r, rpcbus.RateLimitedError)]
        assert len(ok) + len(limited) == 60 and limited and len(ok) <= 20  # one frame, one window
        # other users are not limited, and answers of a limited provider still flow
        assert await asyncio.gather(*(front.call("echo", i, timeout=5) for i in range(40))) \
            == list(range(40))
        async with asyncio.timeout(wait(5)):                 # a later window: served again
            while True:
                try:
                    assert await chatty.call("echo", "later", timeout=5) == "later"
                    break
                except rpcbus.RateLimitedError:
                    await asyncio.sleep(0.05)          # the window is 0.5 s
    assert stats(secured)["io"]["rate_limited"] >= len(limited)


def self_signed(directory):
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rpcbus test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_tls_node_is_verified_by_the_sdk(tmp_path):
    cert, key = self_signed(tmp_path)
    with NodeProcess(env={**FAST, "RPCBUS_SERVER_TLS_CERT": str(cert),
                          "RPCBUS_SERVER_TLS_KEY": str(key)}) as node:
        assert node.url.startswith("wss://127.0.0.1:")
        async with rpcbus.connect(node.url, ca_file=str(cert)) as prov, \
                rpcbus.connect(node.url, ca_file=str(cert)) as caller:
            await prov.provide("echo", lambda d: d)
            assert await caller.call("echo", "over tls", timeout=5) == "over tls"
        with pytest.raises(rpcbus.ConnectFailedError, match="CERTIFICATE_VERIFY_FAILED"):
            await rpcbus.connect(node.url, reconnect=False)      # not trusted by default
        with pytest.raises(rpcbus.ConnectFailedError):
            await rpcbus.connect(node.url.replace("wss:", "ws:"), reconnect=False)


async def test_admin_endpoints_need_the_admin_token_when_one_is_set():
    from .test_operations import get

    def with_header(node, path, token):
        req = urllib.request.Request(node.url.replace("ws://", "http://") + path,
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status

    with NodeProcess(env={**FAST, "RPCBUS_SERVER_ADMIN_TOKEN_SHA256":
                          token_digest("admin-token")}) as node:
        for path in ("/metrics", "/stats", "/cluster", "/dashboard"):
            assert get(node, path)[0] == 401
            assert get(node, path + "?token=wrong")[0] == 401
            assert get(node, path + "?token=admin-token")[0] == 200
            assert with_header(node, path, "admin-token") == 200
        assert get(node, "/readyz") == (200, "ready\n")        # probes stay open
        assert get(node, "/healthz")[0] == 200
