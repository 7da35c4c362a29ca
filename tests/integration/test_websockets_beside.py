"""The SDK's WebSocket stack is its own (h11 reads the handshake): it works beside an old
websockets another library pins (10.4, installed by ./dev setup into
.venv/websockets-old) and with none at all, masking its frames in Python then."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
OLD = ROOT / ".venv" / "websockets-old"

CLIENT = """
import asyncio, sys
{block}
import rpcbus, rpcbus.transport as t

async def main():
    async with rpcbus.connect(sys.argv[1]) as prov, rpcbus.connect(sys.argv[1]) as c:
        await prov.provide("beside.echo", lambda d: d)
        big = bytes(range(256)) * 1024          # 256 KiB: masked, fragmented by nobody
        assert await c.call("beside.echo", big, timeout=10) == big
        assert await c.call("beside.echo", {{"x": [1, None]}}) == {{"x": [1, None]}}
    print("python" if t.apply_mask is t._apply_mask_py else "C")

asyncio.run(main())
"""


@pytest.mark.parametrize("websockets", ["old", "none"])
def test_the_sdk_runs_beside_an_old_websockets_and_without_one(node, websockets):
    if websockets == "old":
        assert OLD.is_dir(), "./dev setup installs websockets 10.4 there"
        env = {**os.environ, "PYTHONPATH": str(OLD)}
        block = "import websockets; assert websockets.version.version == '10.4'"
    else:
        env = dict(os.environ)
        block = "sys.modules['websockets'] = None  # as if it were not installed"
    run = subprocess.run([sys.executable, "-c", CLIENT.format(block=block), node.url],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-1] == ("C" if websockets == "old" else "python")
