"""A machine busy with other work: processes spinning on every core beside a test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def spinning(per_core: int) -> Iterator[None]:
    """``per_core`` Python processes per core, each a busy loop, until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
