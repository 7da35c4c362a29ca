"""deepstream's own client (@deepstream/client 7, from npm: benchmarks/deepstream's
lockfile) against real rpcbus node processes: a Node.js agent
(benchmarks/deepstream/peer.js) driven over its stdin/stdout, one JSON line per command."""

import os
import shutil
from pathlib import Path

import pytest

from ..js.conftest import agents

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "deepstream"


def node_exe():
    """Node.js and deepstream's client, or a skip (a failure under CI: ./dev test installs
    them)."""
    exe = shutil.which("node")
    missing = ("node" if exe is None else
               "deepstream's packages (npm ci in benchmarks/deepstream)"
               if not (PEERS / "node_modules" / "@deepstream" / "client").is_dir() else None)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} missing: ./dev test installs it")
        pytest.skip(f"{missing} missing (./dev test installs it)")
    return exe


@pytest.fixture
async def ds():
    """Start deepstream clients: ``client = await ds()``; each must exit 0 and print
    nothing on stderr."""
    async with agents(node_exe(), str(PEERS / "peer.js"), cwd=str(PEERS),
                      what="deepstream agent") as start:
        yield start
