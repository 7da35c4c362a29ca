"""The frame fast path reads websockets' parser state (rpcbus.transport._at_frame_boundary),
so the websockets range setup.cfg allows is tested at both ends: the suite runs on the
newest release in range, this runs the framing tests again on the lowest (installed beside
by ./dev setup into .venv/websockets-low)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
LOW = ROOT / ".venv" / "websockets-low"


def test_the_framing_tests_pass_on_the_lowest_websockets_allowed():
    assert LOW.is_dir(), "./dev setup installs the lowest websockets allowed there"
    env = {**os.environ, "PYTHONPATH": str(LOW)}
    version = subprocess.run([sys.executable, "-c", "import websockets; "
                              "print(websockets.__version__)"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
    low = next(line.split(">=")[1].split(",")[0] for line in
               (ROOT / "setup.cfg").read_text().splitlines()
               if line.strip().startswith("websockets>="))
    assert version == low                        # that release, not this venv's
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(ROOT / "tests" / "inproc" / "test_framing.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
