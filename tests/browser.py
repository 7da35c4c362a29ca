"""Headless Chromium (Debian's package) driven over the DevTools protocol, for the tests
of what runs in a browser: the dashboard, the JavaScript SDK (the ``browser`` fixture is in
tests/conftest.py)."""

import asyncio
import base64
import itertools
import json
import subprocess
import urllib.request

from websockets.asyncio.client import connect as ws_connect

from rpcbus.broker.local import free_port

from .timing import wait


class Browser:
    """Headless Chromium with one page, evaluated through the DevTools protocol."""

    def __init__(self, exe, profile):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-address=127.0.0.1",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={profile}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws = None
        self._ids = itertools.count(1)

    async def open(self):
        async with asyncio.timeout(wait(30)):
            while True:                                # until DevTools lists the page
                try:
                    pages = await asyncio.to_thread(self._json, "/json/list")
                    page = next(p for p in pages if p.get("type") == "page")
                    break
                except (OSError, StopIteration, ValueError):
                    assert self.proc.poll() is None, "chromium exited"
                    await asyncio.sleep(0.1)
        self.ws = await ws_connect(page["webSocketDebuggerUrl"], max_size=None)

    def _json(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
            return json.load(r)

    async def send(self, method, **params):
        cid = next(self._ids)
        await self.ws.send(json.dumps({"id": cid, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == cid:
                assert "error" not in msg, msg
                return msg["result"]

    async def value(self, expression):
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]   # a typo, say
        return result["result"].get("value")

    async def wait_for(self, expression, timeout=15.0):
        """Until ``expression`` is truthy in the page; returns its value."""
        try:
            async with asyncio.timeout(wait(timeout)):
                while not (value := await self.value(expression)):
                    await asyncio.sleep(0.1)
        except TimeoutError:
            page = await self.value("document.body && document.body.innerText")
            raise AssertionError(f"never true: {expression}\npage:\n{page}") from None
        return value

    async def screenshot(self, url, width, height, path):
        """Open ``url`` in a ``width`` x ``height`` viewport, wait for its images, and save
        the whole page (beyond the viewport) as a PNG at ``path``."""
        await self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=False)
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && "
                            "[...document.images].every(i => i.complete)")
        shot = await self.send("Page.captureScreenshot", format="png",
                               captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self):
        if self.ws is not None:
            await self.ws.close()
        self.proc.kill()
        self.proc.wait()
