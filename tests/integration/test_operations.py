"""What an operator sees of one node: /metrics, /healthz and /readyz, trace context."""

import asyncio
import signal
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rpcbus

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def get(proc, path):
    """(status, body) of an HTTP GET on the node's port."""
    try:
        with urllib.request.urlopen(proc.url.replace("ws://", "http://") + path,
                                    timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(proc):
    """{(sample name, frozenset(labels)): value} from /metrics."""
    status, text = get(proc, "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_count_calls_by_rpc_and_outcome_with_latency_histograms(node):
    def value(m, name, **labels):
        return m.get((name, frozenset(labels.items())), 0.0)

    before = samples(node)
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("ops.echo", lambda d: d)
        await prov.provide("ops.fail", lambda d: 1 / 0)
        await prov.provide("ops.other", lambda d: d)
        for _ in range(100):
            await asyncio.gather(*(caller.call("ops.echo", i, timeout=5) for i in range(7)),
                                 caller.call("ops.other", 0, timeout=5))
        for _ in range(3):
            try:
                await caller.call("ops.fail", timeout=5)
            except rpcbus.ProviderError:
                pass
        try:
            await caller.call("ops.nobody", timeout=5)
        except rpcbus.NoProviderError:
            pass
        after = samples(node)
        assert value(after, "rpcbus_providers", rpc="ops.echo") == 1

    def change(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)
    assert change("rpcbus_calls_total", rpc="ops.echo", outcome="ok") == 700
    assert change("rpcbus_calls_total", rpc="ops.fail", outcome="PROVIDER_ERROR") == 3
    # a name nobody provides gets no row of its own (junk names must not push real ones out)
    assert value(after, "rpcbus_calls_total", rpc="_other", outcome="NO_PROVIDER") >= 1
    assert value(after, "rpcbus_calls_total", rpc="ops.nobody", outcome="NO_PROVIDER") == 0
    # every call's latency, by outcome: each histogram counts what the counter beside it does
    counted = {(dict(labels)["rpc"], dict(labels)["outcome"]): n for (name, labels), n
               in after.items() if name == "rpcbus_calls_total"}
    assert len(counted) >= 4
    for (rpc, outcome), n in counted.items():
        count = value(after, "rpcbus_call_duration_seconds_count", rpc=rpc, outcome=outcome)
        assert count == n == value(after, "rpcbus_call_duration_seconds_bucket", rpc=rpc,
                                   outcome=outcome, le="+Inf"), (rpc, outcome)
    assert 0 < value(after, "rpcbus_call_duration_seconds_sum", rpc="ops.echo",
                     outcome="ok") < 700 * 5
    assert value(after, "rpcbus_up") == 1 and value(after, "rpcbus_connections") >= 0
    # the process, the interpreter and the build, beside the node's own
    assert value(after, "rpcbus_build_info", version=rpcbus.__version__) == 1
    assert value(after, "process_cpu_seconds_total") > 0
    assert value(after, "process_resident_memory_bytes") > 0
    assert value(after, "process_open_fds") > 0


async def test_traceparent_reaches_the_handler(node):
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("ops.trace", lambda d, ctx: ctx.traceparent)
        assert await caller.call("ops.trace", traceparent=TRACE, timeout=5) == TRACE
        assert await caller.call("ops.trace", timeout=5) is None
        with pytest.raises(rpcbus.InvalidMessageError, match="traceparent"):
            await caller.call("ops.trace", traceparent="x" * 300, timeout=5)


async def test_readyz_is_503_while_draining_and_healthz_follows(start_node):
    node = start_node()
    assert get(node, "/readyz") == (200, "ready\n") and get(node, "/healthz")[0] == 200
    release, started = asyncio.Event(), asyncio.Event()

    async def held(d):
        started.set()
        await release.wait()
        return d

    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("ops.held", held)
        call = asyncio.create_task(caller.call("ops.held", 1, timeout=10))
        await started.wait()
        node.signal(signal.SIGTERM)
        await asyncio.to_thread(node.wait_event, "node_draining")
        assert get(node, "/readyz") == (503, "draining\n")       # load balancers: away
        assert get(node, "/healthz")[0] == 503
        with pytest.raises(rpcbus.ConnectFailedError, match="503"):
            await rpcbus.connect(node.url, reconnect=False)       # no new clients
        release.set()
        assert await call == 1
    assert await asyncio.to_thread(node.wait_exit, 20) == 0


async def test_logs_name_node_and_module_levels_per_module_and_no_line_per_call(start_node):
    node = start_node(RPCBUS_LOG_LEVELS='{"rpcbus": "warning", "rpcbus.node": "info"}')
    async with rpcbus.connect(node.url) as prov, rpcbus.connect(node.url) as caller:
        await prov.provide("ops.quiet", lambda d: d)
        lines_before = len(node.lines)
        await asyncio.gather(*(caller.call("ops.quiet", i, timeout=5) for i in range(300)))
        assert len(node.lines) - lines_before < 5           # no line per successful call
    await asyncio.to_thread(node.stop)
    lines = list(node.lines)
    assert any(x.get("event") == "node_ready" and x.get("module") == "rpcbus.node"
               for x in lines)
    assert any(x.get("event") == "session_closed" for x in lines)  # rpcbus.node: info
    assert not [x for x in lines if x.get("event") == "node_starting"]  # rpcbus.cli: warning
    structured = [x for x in lines if x.get("event") != "raw"]
    assert structured and all(x.get("node") and x.get("module") for x in structured)
