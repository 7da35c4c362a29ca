"""The JavaScript SDK in a real headless Chromium: a page imports it as an ES module
(the import map clients/js/README.md documents, no bundler) from the package as
`npm pack` makes it, installed as npm lays it out, calls an RPC a Python program
provides on another node, and provides one that Python calls."""

import asyncio
import http.server
import json
import re
import shutil
import subprocess
import tarfile
import threading
from functools import partial

import pytest

import rpcbus
from rpcbus.broker.local import LocalCluster

from ..cluster.conftest import FAST
from ..timing import wait
from .conftest import JS, node_exe


def documented_import_map() -> str:
    """The import map of clients/js/README.md's page, as written there."""
    readme = (JS / "README.md").read_text()
    found = re.search(r'<script type="importmap">(.*?)</script>', readme, re.S)
    assert found, "clients/js/README.md documents no import map"
    return found.group(1)


PAGE = """<!doctype html>
<meta charset="utf-8">
<title>rpcbus in a page</title>
<script type="importmap">IMPORT_MAP</script>
<script type="module">
import { connect, RpcError } from 'rpcbus'
const node = new URLSearchParams(location.search).get('node')
window.states = []
try {
  const c = await connect([node], { name: 'browser', onState: (s) => window.states.push(s) })
  await c.provide('web.greet', (name, ctx) => ({ text: `hello ${name}`, caller: ctx.caller,
                                                 bytes: new Uint8Array([1, 2, 3]) }))
  window.added = await c.call('py.add', { a: 2, b: 40 }, { timeout: 5000 })
  try { await c.call('py.missing', null, { timeout: 2000 }) } catch (e) {
    window.missing = e instanceof RpcError ? e.code : String(e)
  }
  window.client = c
  window.ready = true
} catch (e) { window.failed = String(e && e.stack || e) }
</script>
"""


class _Files(http.server.SimpleHTTPRequestHandler):
    """The page at /, the rest from an app's folder where npm installed the SDK."""

    extensions_map = {".js": "text/javascript", ".mjs": "text/javascript", "": "text/plain"}

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] == "/":
            body = PAGE.replace("IMPORT_MAP", documented_import_map()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def log_message(self, *args):
        pass


def installed(tmp_path):
    """An app's folder with the SDK as ``npm install rpcbus-X.tgz`` lays it out: the
    ``npm pack`` tarball unpacked in node_modules/rpcbus, its dependency beside it
    (copied from clients/js's own install: no registry traffic)."""
    subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(tmp_path)], cwd=JS,
                   check=True, capture_output=True)
    [tgz] = tmp_path.glob("rpcbus-*.tgz")
    modules = tmp_path / "app" / "node_modules"
    modules.mkdir(parents=True)
    with tarfile.open(tgz) as packed:
        packed.extractall(tmp_path / "unpacked", filter="data")
    (tmp_path / "unpacked" / "package").rename(modules / "rpcbus")
    shutil.copytree(JS / "node_modules" / "@msgpack", modules / "@msgpack")
    version = json.loads((modules / "rpcbus" / "package.json").read_text())["version"]
    assert version == rpcbus.__version__                # one version for both SDKs
    return modules.parent


@pytest.fixture
def site(tmp_path):
    node_exe()                                        # the SDK's packages are installed
    app = installed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Files, directory=app))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_a_page_calls_python_and_python_calls_the_page(browser, site):
    c = LocalCluster(nodes=2, env=FAST).start()
    try:
        n1, n2 = c.nodes
        async with rpcbus.connect(n1.url, name="py") as py:
            await py.provide("py.add", lambda d: d["a"] + d["b"])
            await browser.send("Page.navigate", url=f"{site}/?node={n2.url}")
            await browser.wait_for("window.ready || window.failed")
            assert await browser.value("window.failed || null") is None
            assert await browser.value("window.added") == 42          # page -> n2 -> n1
            assert await browser.value("window.missing") == "NO_PROVIDER"
            async with asyncio.timeout(wait(10)):
                while True:                                           # n1 hears of web.greet
                    try:
                        got = await py.call("web.greet", "python", timeout=5)
                        break
                    except rpcbus.NoProviderError:
                        await asyncio.sleep(0.05)
            assert got == {"text": "hello python", "caller": got["caller"],
                           "bytes": b"\x01\x02\x03"}
            assert got["caller"].startswith("py@")
            assert await browser.value("window.states") == ["connected"]
            await browser.value("window.client.close()")
            await browser.wait_for("window.client.state === 'closed'")
    finally:
        codes = c.stop()
    assert all(code == 0 for code in codes.values()), codes
