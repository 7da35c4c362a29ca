"""rpcbus.connect_sync: the blocking client, against a real node, from plain (non-async)
test functions as a script would use it."""

import asyncio
import signal
import subprocess
import sys
import threading
import time

import pytest

import rpcbus

from ..hang import Hang


def test_calls_and_blocking_handlers_from_plain_code(node):
    with rpcbus.connect_sync(node.url, name="script") as prov, \
            rpcbus.connect_sync(node.url) as caller:
        meeting = threading.Barrier(5, timeout=10)

        def add(d):
            return d["a"] + d["b"]

        def meet(d):                         # blocks until 5 run at once: worker threads
            meeting.wait()
            return threading.current_thread().name

        def twice(d, ctx):                   # blocking, with a context, calling through
            return {"by": ctx.user, "sum": prov.call("sync.add", {"a": d, "b": d}, timeout=5)}

        async def echo(d):                   # async: on the client's loop
            return d

        prov.provide("sync.add", add)
        prov.provide("sync.meet", meet)
        prov.provide("sync.sleep", time.sleep)
        prov.provide("sync.twice", twice)
        prov.provide("sync.echo", echo)
        assert caller.call("sync.add", {"a": 1, "b": 2}, timeout=5) == 3
        assert caller.call("sync.twice", 4, timeout=5) == {"by": None, "sum": 8}
        assert caller.call("sync.echo", [1, "x"], timeout=5) == [1, "x"]

        # blocking handlers run side by side, and so do calls from several threads
        answers = [None] * 5

        def one(i):
            answers[i] = caller.call("sync.meet", i, timeout=10)

        callers = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        assert len(set(answers)) == 5 and "rpcbus-sync" not in answers, answers
        assert threading.main_thread().name not in answers

        # errors are the async client's, caught the usual way
        with pytest.raises(rpcbus.NoProviderError):
            caller.call("sync.nobody", timeout=5)
        with pytest.raises(TimeoutError):
            caller.call("sync.sleep", 0.5, timeout=0.05)
        # an async handler runs on the client's loop: a blocking method there is refused,
        # and the client goes on serving
        async def misuse(d):
            prov.close()

        prov.provide("sync.misuse", misuse)
        with pytest.raises(rpcbus.ProviderError, match="its own loop"):
            caller.call("sync.misuse", timeout=5)
        assert caller.call("sync.echo", 2, timeout=5) == 2 and not prov.closed
        prov.unprovide("sync.add")
        with pytest.raises(rpcbus.NoProviderError):
            caller.call("sync.add", {"a": 0, "b": 0}, timeout=5)
    assert prov.closed and caller.closed
    with pytest.raises(RuntimeError, match="closed"):
        caller.call("sync.echo", 1)
    assert not any(t.name == "rpcbus-sync" for t in threading.enumerate())


def test_works_where_a_loop_already_runs_and_fails_to_connect_in_one_error(node):
    async def notebook_cell():               # Jupyter runs cells on a running loop
        with rpcbus.connect_sync(node.url) as c:
            c.ping()
            return c.url

    assert asyncio.run(notebook_cell()) == node.url
    with pytest.raises(rpcbus.ConnectFailedError):
        rpcbus.connect_sync("ws://127.0.0.1:9", open_timeout=1, reconnect=False)
    assert not any(t.name == "rpcbus-sync" for t in threading.enumerate())


def test_ctrl_c_in_a_script_blocked_in_call_cancels_the_providers_handler(node):
    hang = Hang(threading.Event)
    started, cancelled = hang.started, hang.cancelled

    script = ("import rpcbus, sys\n"
              "with rpcbus.connect_sync(sys.argv[1]) as c:\n"
              "    c.call('sync.hang', timeout=30)\n")
    with rpcbus.connect_sync(node.url) as prov:
        prov.provide("sync.hang", hang)
        proc = subprocess.Popen([sys.executable, "-c", script, node.url],
                                stderr=subprocess.PIPE, text=True)
        try:
            assert started.wait(10), "the call never reached the provider"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=10)
        finally:
            proc.kill()
        assert "KeyboardInterrupt" in err and proc.returncode != 0
        assert cancelled.wait(10), "the provider's handler kept running"


def test_event_handlers_of_the_blocking_client_may_block_and_keep_the_order(node):
    """Plain-function event handlers run one at a time in the events thread: one that
    blocks holds back the next event of the client, never its calls or its loop."""
    got, done = [], threading.Event()
    with rpcbus.connect_sync(node.url) as sub, rpcbus.connect_sync(node.url) as pub:
        def slow(data):
            time.sleep(0.01 if data % 10 else 0.05)   # blocks: fine in this thread
            got.append((data, threading.current_thread().name))
            if data == 99:
                done.set()

        sub.subscribe("sync.events", slow)
        for i in range(100):
            pub.emit("sync.events", i)
        sub.ping()          # the loop is free while handlers block
        assert done.wait(10)
        sub.unsubscribe("sync.events")
    assert [d for d, _ in got] == list(range(100))
    assert {t for _, t in got} == {"rpcbus-sync-events_0"}


def test_presence_from_the_blocking_client(node):
    seen, came = [], threading.Event()
    with rpcbus.connect_sync(node.url, name="sync-watcher") as watcher:
        def changed(user, online):
            seen.append((user, online, threading.current_thread().name))
            came.set()

        watcher.watch_presence(changed, ["sync-late"])
        with rpcbus.connect_sync(node.url, name="sync-late"):
            assert came.wait(10)
            assert watcher.presence(["sync-late", "sync-watcher"]) == {
                "sync-late": True, "sync-watcher": True}
        watcher.unwatch_presence()
    assert seen[0] == ("sync-late", True, "rpcbus-sync-events_0")
