"""Suite-wide: no test may leave a process behind (nodes, redis-server, workers), nor a
raw protocol connection open (warnings are errors: an unclosed socket fails a later test)."""

import os
import shutil

import psutil
import pytest

from .browser import Browser
from .integration.raw import RawPeer
from .timing import UNIT


def pytest_collection_modifyitems(items):
    """Each test's timeout (pyproject's, or its own mark) times the suite's timing unit."""
    if UNIT == 1:
        return
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = mark.args[0] if mark and mark.args else item.config.getini("timeout")
        item.add_marker(pytest.mark.timeout(float(seconds) * UNIT))


@pytest.fixture(autouse=True)
async def raw_peers_dropped():
    """After each test, the raw peers it left open are dropped (as a crashed process's)."""
    yield
    peers, RawPeer.opened[:] = list(RawPeer.opened), []
    for peer in peers:
        if peer.ws.transport is not None and not peer.ws.transport.is_closing():
            peer.abort()


# processes a fixture wider than a module keeps (and stops) itself: not a module's leak
SHARED_PIDS: set[int] = set()


@pytest.fixture(autouse=True, scope="module")
def no_process_left_behind():
    """After each module, every child process it started has exited."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and not _shared(p) and _running(p)]
    for p in left:
        try:
            p.kill()
        except psutil.Error:  # gone (or a zombie) since: nothing left to stop
            pass
    assert not left, "processes left running: " + "; ".join(_command(p) for p in left)


def _command(proc):
    """The start of ``proc``'s command line, or its pid once it cannot be read (it exited,
    or is a zombie nobody reaps: on some machines orphans are not reaped)."""
    try:
        return " ".join(proc.cmdline()[:6])
    except psutil.Error:
        return f"pid {proc.pid}"


def _shared(proc):
    """``proc`` is, or descends from, a process a wider fixture keeps."""
    try:
        return proc.pid in SHARED_PIDS or any(a.pid in SHARED_PIDS for a in proc.parents())
    except psutil.Error:
        return False


def _running(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # gone, or a zombie psutil cannot read
        return False


@pytest.fixture
async def browser(tmp_path):
    """A headless Chromium with one blank page (tests/browser.py)."""
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: ./dev test installs it")
        pytest.skip("chromium is not installed (./dev test installs it)")
    b = Browser(exe, tmp_path / "profile")
    try:
        await b.open()
        yield b
    finally:
        await b.close()
