"""The dashboard page in a real headless Chromium (Debian's package), driven over the
DevTools protocol: it shows a running 2-node cluster and follows it live."""

import asyncio

import pytest

import rpcbus

ROWS = """Array.from(document.querySelectorAll('#nodes tbody tr'))
          .map(r => Array.from(r.cells).map(c => c.textContent))"""


def rpc_row(rpc, table="rpcs"):
    return f"""(() => {{ const r = document.querySelector('#{table} tr[data-rpc="{rpc}"]');
              return r && Array.from(r.cells).map(c => c.textContent); }})()"""


def calls_row(rpc, ready):
    """The rpc's row in 'Calls by rpc' once ``ready`` (JS over its cells ``c``) holds."""
    return f"(() => {{ const c = {rpc_row(rpc, 'calls')}; return c && ({ready}) && c; }})()"


async def test_dashboard_shows_the_cluster_and_follows_it(make_cluster, browser):
    c = make_cluster(nodes=2)
    n1, n2 = c.nodes
    async with rpcbus.connect(n2.url) as p2, rpcbus.connect(n1.url) as caller:
        await p2.provide("dash.before", lambda d: d)

        def fails(d):
            raise ValueError("no")

        await p2.provide("dash.fails", fails)
        await browser.send("Page.navigate", url=n1.url.replace("ws://", "http://") + "/dashboard")
        rows = await browser.wait_for(f"(() => {{ const rows = {ROWS};"
                                      " return rows.length == 2 && rows; })()")
        assert [r[0] for r in rows] == ["n1", "n2"] and {r[1] for r in rows} == {"ready"}
        assert [r[2] for r in rows] == [n1.url, n2.url]
        header = await browser.value(
            "Array.from(document.querySelectorAll('#rpcs thead th')).map(c => c.textContent)")
        assert header == ["rpc", "n1", "n2"]
        assert await browser.wait_for(rpc_row("dash.before")) == ["dash.before", "", "1"]

        async with rpcbus.connect(n1.url) as p1:         # a provider joins, on n1
            await p1.provide("dash.joined", lambda d: d)
            assert await browser.wait_for(rpc_row("dash.joined")) == ["dash.joined", "1", ""]

            stop = asyncio.Event()

            async def load():
                while not stop.is_set():
                    await asyncio.gather(*(caller.call("dash.before", i, timeout=5)
                                           for i in range(20)))
                    with pytest.raises(rpcbus.ProviderError):
                        await caller.call("dash.fails", None, timeout=5)

            task = asyncio.create_task(load())
            try:
                # calls/s of n1, the callers' node; n2 served every call and counts none
                rates = await browser.wait_for(
                    f"(() => {{ const r = {ROWS}; return r.length == 2 && r[0][6] &&"
                    " parseFloat(r[0][6]) > 0 && [r[0][6], r[1][6]]; })()")
                assert float(rates[0]) > 0 and float(rates[1]) == 0
                # n1's callers' calls all went to the provider on n2: none stayed local
                stayed = await browser.wait_for(
                    f"(() => {{ const r = {ROWS}; return r.length == 2 && r[0][8] != '-'"
                    " && r[0][8]; })()")
                assert stayed == "0 %"
                # per rpc, over both nodes: rate, errors, latency percentiles
                ok = await browser.wait_for(calls_row(
                    "dash.before", "parseFloat(c[1]) > 0 && c[3] && c[4]"))
                assert ok[2] == "0.0 %" and ok[3].startswith("≤ ") and ok[4].startswith("≤ ")
                failing = await browser.wait_for(calls_row("dash.fails", "parseFloat(c[1]) > 0"))
                assert failing[2] == "100.0 %"
                # the live chart: calls/s of the whole cluster, poll after poll
                last = await browser.wait_for(
                    "(() => { const s = document.getElementById('chart');"
                    " return s.dataset.points >= 3 && parseFloat(s.dataset.last) > 0"
                    " && s.dataset.last; })()")
                assert float(last) > 0
                assert await browser.value(
                    "document.querySelectorAll('#chart polyline').length") == 2
            finally:
                stop.set()
                await task
        assert await browser.wait_for(f"!{rpc_row('dash.joined')}")   # gone when it leaves
