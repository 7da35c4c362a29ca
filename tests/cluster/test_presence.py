"""Presence across the cluster (docs/events.md): who is logged in, on any node, with real
node processes on a real Redis and the Python SDK; notices on login and logout, a user
on two nodes, a node killed under its users, a node started later that learns everyone."""

import asyncio

import rpcbus

from .conftest import stats

WAIT = 10.0


class Changes:
    """A presence handler the test can await."""

    def __init__(self):
        self.seen = []
        self._more = asyncio.Event()

    def __call__(self, user, online):
        self.seen.append((user, online))
        self._more.set()

    async def until(self, *expected, timeout=WAIT):
        try:
            async with asyncio.timeout(timeout):
                while self.seen[:len(expected)] != list(expected):
                    self._more.clear()
                    await self._more.wait()
        except TimeoutError:
            raise AssertionError(f"waited for {expected}, saw {self.seen}") from None
        assert self.seen == list(expected), self.seen


async def until_present(client, expected, timeout=WAIT):
    async with asyncio.timeout(timeout):
        while (now := await client.presence()) != expected:
            await asyncio.sleep(0.05)
    return now


async def test_logins_and_logouts_on_any_node_reach_every_watcher_once(make_cluster):
    c = make_cluster(nodes=3)
    n1, n2, n3 = c.nodes
    everyone, of_dave = Changes(), Changes()
    async with rpcbus.connect(n1.url, name="watcher") as watcher, \
            rpcbus.connect(n1.url, name="carol") as carol:
        await watcher.watch_presence(everyone)
        await carol.watch_presence(of_dave, ["dave"])
        bob1 = await rpcbus.connect(n2.url, name="bob")
        await everyone.until(("bob", True))
        bob2 = await rpcbus.connect(n3.url, name="bob")   # a second connection: no news
        dave = await rpcbus.connect(n3.url, name="dave")
        await everyone.until(("bob", True), ("dave", True))
        await of_dave.until(("dave", True))
        assert await until_present(carol, ["bob", "carol", "dave", "watcher"])
        assert await watcher.presence(["bob", "zed"]) == {"bob": True, "zed": False}
        await bob1.close()                                 # still on n3
        await dave.close()
        await everyone.until(("bob", True), ("dave", True), ("dave", False))
        await bob2.close()
        await everyone.until(("bob", True), ("dave", True), ("dave", False), ("bob", False))
        await of_dave.until(("dave", True), ("dave", False))   # only dave's
        await watcher.unwatch_presence()
        again = await rpcbus.connect(n2.url, name="bob")
        await until_present(carol, ["bob", "carol", "watcher"])
        await again.close()
        await until_present(carol, ["carol", "watcher"])
        assert everyone.seen[-1] == ("bob", False)         # unwatched: nothing more came


async def test_a_node_killed_takes_its_users_and_a_new_node_learns_everyone(make_cluster):
    c = make_cluster(nodes=3)
    n1, n2, n3 = c.nodes
    changes = Changes()
    async with rpcbus.connect(n1.url, name="watcher") as watcher, \
            rpcbus.connect(n2.url, name="ann", reconnect=False) as ann, \
            rpcbus.connect(n3.url, name="eve", reconnect=False):
        # watched once n1 knows both: else n1 may learn of one after the watch began,
        # and tell it (a login it had not heard of), before the kill's news
        await until_present(watcher, ["ann", "eve", "watcher"])
        await watcher.watch_presence(changes, ["eve", "ann"])
        n3.kill()                                  # eve's node: she is gone with it
        await changes.until(("eve", False))        # once it is declared dead (0.75 s)
        # a node started now hears of everyone from their nodes' heartbeats
        new = await asyncio.to_thread(c.restart, 2)
        async with rpcbus.connect(new.url, name="late") as late:
            assert await until_present(late, ["ann", "late", "watcher"])
        await ann.close()
        await changes.until(("eve", False), ("ann", False))
    async with asyncio.timeout(WAIT):   # everyone gone: the tables are empty again
        while (figures := stats(n1)["presence"])["online"] or figures["watchers"]:
            await asyncio.sleep(0.05)
