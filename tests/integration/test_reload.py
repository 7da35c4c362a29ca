"""A node reads its configuration again on SIGHUP and on ``rpcbus reload``, and tells
systemd (conf/rpcbus.service, Type=notify) when it is ready, reloading and stopping.

One node process with a config file of users; the file is rewritten between reloads."""

import asyncio
import configparser
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import rpcbus
from rpcbus.broker.auth import hash_password, token_digest
from rpcbus.broker.config import ServerSection
from rpcbus.broker.lifecycle import NOTICE_WAIT
from rpcbus.broker.process import NodeProcess

from ..timing import wait

ROOT = Path(__file__).parents[2]
ADMIN = "admin-secret-token"
BOB_TOKEN = "bob-token-1"


def config(tmp_path: Path, *, alice_calls: str, bob_provides: str, ack: float = 1.0,
           bob_token: str = BOB_TOKEN, broken: bool = False) -> Path:
    path = tmp_path / "node.toml"
    path.write_text("this is [not toml\n" if broken else f"""
[rpc]
ack_timeout = {ack}
[server]
admin_token_sha256 = "{token_digest(ADMIN)}"
[auth.users.alice]
password = "{ALICE_HASH}"
call = [{alice_calls}]
[auth.users.bob]
token_sha256 = "{token_digest(bob_token)}"
provide = [{bob_provides}]
""")
    return path


ALICE_HASH = hash_password("alice-pw")


def reload_cli(url: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rpcbus.broker", "reload", "--node", url,
                           "--admin-token", token], capture_output=True, text=True, timeout=30)


async def denied(client: rpcbus.Client, name: str) -> bool:
    try:
        await client.call(name, 1, timeout=5)
    except rpcbus.PermissionDeniedError:
        return True
    return False


async def test_a_reload_changes_rights_at_once_and_a_broken_file_changes_nothing(tmp_path):
    path = config(tmp_path, alice_calls='"pub.*"', bob_provides='"pub.*"')
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    listener.settimeout(10)
    node = NodeProcess("--config", str(path),
                       env={"NOTIFY_SOCKET": str(tmp_path / "notify")}).start()

    def notice() -> dict[str, str]:
        lines = listener.recv(4096).decode().splitlines()
        return dict(line.split("=", 1) for line in lines)

    try:
        assert notice()["READY"] == "1"
        async with rpcbus.connect(node.url, user="alice", password="alice-pw") as alice, \
                rpcbus.connect(node.url, token=BOB_TOKEN) as bob:
            release, running = asyncio.Event(), asyncio.Event()

            async def slow(d):
                running.set()
                await release.wait()
                return d
            await bob.provide("pub.echo", lambda d: d)
            await bob.provide("pub.slow", slow)
            await bob.provide("pub.other", lambda d: -d)
            assert await alice.call("pub.echo", 1) == 1
            under_way = asyncio.ensure_future(alice.call("pub.slow", 7, timeout=10))
            async with asyncio.timeout(wait(5)):
                await running.wait()                            # in flight at the reload

            # alice may call only pub.other and pub.slow, bob provide pub.other and
            # pub.slow; the ack timeout changes too (kept until a restart)
            config(tmp_path, alice_calls='"pub.other", "pub.slow"',
                   bob_provides='"pub.other", "pub.slow"', ack=0.5)
            node.signal(__import__("signal").SIGHUP)
            assert notice()["RELOADING"] == "1" and notice()["READY"] == "1"
            done = node.wait_event("config_reloaded")
            assert "auth.users" in done["applied"] and done["needs_restart"] == ["rpc.ack_timeout"]
            assert await denied(alice, "pub.echo")            # at once, same session
            assert await alice.call("pub.other", 2) == -2
            release.set()
            assert await under_way == 7                         # the call in flight finished
            assert node.wait_event("session_rights_changed")["withdrawn"] == 1  # pub.echo

            # a file that does not parse: refused in one line, nothing changes
            config(tmp_path, alice_calls="", bob_provides="", broken=True)
            refused = reload_cli(node.url)
            assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
            assert "refused, the running configuration kept" in refused.stderr
            assert notice()["RELOADING"] == "1" and notice()["READY"] == "1"
            assert await alice.call("pub.other", 3) == -3
            assert reload_cli(node.url, "wrong").returncode == 1   # the admin token only

            # bob's token rotated: the session that logged in with the old one keeps no
            # rights (the new token works), alice's password is unchanged
            config(tmp_path, alice_calls='"pub.*"', bob_provides='"pub.*"',
                   bob_token="bob-token-2")
            ok = reload_cli(node.url)
            assert ok.returncode == 0 and ok.stdout.startswith("reloaded: auth.users")
            assert notice()["RELOADING"] == "1" and notice()["READY"] == "1"
            with pytest.raises(rpcbus.NoProviderError):   # bob's names were withdrawn
                await alice.call("pub.other", 4, timeout=2)
            async with rpcbus.connect(node.url, token="bob-token-2") as bob2:
                await bob2.provide("pub.other", lambda d: d * 10)
                assert await alice.call("pub.other", 4) == 40
        node.signal(__import__("signal").SIGTERM)
        assert notice()["STOPPING"] == "1"
        assert node.wait_exit() == 0
    finally:
        node.kill()
        listener.close()


def test_the_unit_file_stops_after_the_drain_and_reloads_with_sighup():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keys keep their case, as systemd reads them
    unit.read(ROOT / "conf" / "rpcbus.service")
    service = unit["Service"]
    assert service["Type"] == "notify" and service["KillSignal"] == "SIGTERM"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    stop = float(service["TimeoutStopSec"])
    assert stop > ServerSection().drain_timeout + NOTICE_WAIT + 5
    assert service["ExecStart"].split()[1:3] == ["node", "--config"]
    assert os.path.basename(service["ExecStart"].split()[0]) == "rpcbus"
