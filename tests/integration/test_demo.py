"""The README's first command, as a newcomer meets it on a machine busy with other work."""

import subprocess
import sys

from ..busy import spinning


def test_the_demo_passes_beside_processes_spinning_on_every_core():
    """Four processes per core spin beside the demo (before: its 10,000 concurrent calls
    failed NO_PROVIDER, as the providers, too slow to accept in a fixed second, refused
    them as stale one after another; the log warned of stale requests in doubling
    numbers). Now every call is answered, nothing a newcomer reads as trouble is printed,
    and the share line says where the calls went."""
    with spinning(4):
        demo = subprocess.run([sys.executable, "-m", "rpcbus.broker", "demo"],
                              capture_output=True, text=True, timeout=240)
    out = demo.stdout + demo.stderr
    assert demo.returncode == 0, out
    assert "10,000 concurrent calls from n3: all correct" in out, out
    assert "served on n1" in out and "stopped: n1 exit 0, n2 exit 0, n3 exit 0" in out, out
    for alarming in ("WARNING", "Traceback", "ERROR", "NO_PROVIDER: no provider of 'math.add'"):
        assert alarming not in out, out
