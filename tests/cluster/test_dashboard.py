"""The dashboard page in a real headless Chromium (Debian's package), driven over the
DevTools protocol: it shows a running 2-node cluster and follows it live."""

import asyncio
import re

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
        await p2.provide("dash.quiet", lambda d: d)      # same connection, never called

        def fails(d):
            raise ValueError("no")

        await p2.provide("dash.fails", fails)
        await browser.send("Page.navigate", url=n1.url.replace("ws://", "http://") + "/dashboard")
        # the first paint has data: the nodes and their rates (two polls 0.25 s apart),
        # not "connecting…" and empty tables for two seconds
        first = await browser.wait_for(f"(() => {{ const rows = {ROWS};"
                                       " return rows.length == 2 && rows[0][6] !== '' &&"
                                       " document.getElementById('status').textContent; })()",
                                       timeout=1.5)
        assert "connecting" not in first
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
                # per rpc, over both nodes: rate, errors (by code), latency percentiles
                # read inside their buckets (a number, not a bucket's bound)
                ok = await browser.wait_for(calls_row(
                    "dash.before", "parseFloat(c[1]) > 0 && c[4] && c[5]"))
                assert ok[2] == "0.0 %" and ok[3] == ""
                for p in ok[4:6]:
                    assert re.fullmatch(r"[\d.]+ (ms|s)", p), ok
                assert float(ok[4].split()[0]) * (1 if ok[4].endswith(" ms") else 1000) <= \
                    float(ok[5].split()[0]) * (1 if ok[5].endswith(" ms") else 1000)
                failing = await browser.wait_for(calls_row("dash.fails", "parseFloat(c[1]) > 0"))
                assert failing[2] == "100.0 %" and re.fullmatch(r"PROVIDER_ERROR \d+", failing[3])
                # each provider, as its node measures it (local-first: rate, latency)
                provider = await browser.wait_for(
                    "(() => { const r = document.querySelector("
                    "'#providers tr[data-rpc=\"dash.before\"]');"
                    " return r && parseFloat(r.cells[3].textContent) > 0 &&"
                    " Array.from(r.cells).map(c => c.textContent); })()")
                assert provider[2] == "n2" and re.fullmatch(r"[\d.]+ (ms|s)", provider[4])
                # per (provider, rpc): the quiet name of the same connection shows none
                # of its busy name's calls
                quiet = await browser.value(
                    "Array.from(document.querySelector("
                    "'#providers tr[data-rpc=\"dash.quiet\"]').cells).map(c => c.textContent)")
                assert quiet[1] == provider[1] and quiet[3:] == ["0.0", "–", "0"], quiet
                # the live chart: calls/s of the whole cluster, poll after poll
                last = await browser.wait_for(
                    "(() => { const s = document.getElementById('chart');"
                    " return s.dataset.points >= 3 && parseFloat(s.dataset.last) > 0"
                    " && s.dataset.last; })()")
                assert float(last) > 0
                assert await browser.value(
                    "document.querySelectorAll('#chart polyline').length") == 2
                # its scale: calls/s at 0, half and the top, and the last minute to now
                labels = await browser.value(
                    "Array.from(document.querySelectorAll('#chart text')).map(t => t.textContent)")
                top = await browser.value("document.getElementById('chart').dataset.top")
                assert labels[0] == "0/s" and labels[2].endswith("/s") and float(top) > 0
                assert labels[-2:] == ["−59 s", "now"]
            finally:
                stop.set()
                await task
        assert await browser.wait_for(f"!{rpc_row('dash.joined')}")   # gone when it leaves
