"""The PySpark job against a plain-Python reference on the same generated history:
every count equal, every histogram percentile the same bucket bound, every finding
(fairness, outliers, hot rpcs, peak minutes, weights) the same; then the weights file
and the report it writes."""

import glob
import math
import os
import statistics
from collections import defaultdict

import pytest

from rpcbus.analytics import analysis, findings, rollup
from rpcbus.analytics import episodes as episodes_mod
from rpcbus.analytics.historygen import generate
from rpcbus.broker.rpcstats import BOUNDS
from rpcbus.broker.weights import load as load_weights

from .conftest import PYSPARK_WARNINGS, history_row, history_rows, write_rows

COUNTS = rollup.COUNTS
HALF_LIFE = 1800.0

pytestmark = PYSPARK_WARNINGS


def quantiles(buckets, lo=None, hi=None):
    """The bucket whose running count reaches q (integer arithmetic), then log-linear
    interpolation in it by rank, clamped to the sampled min and max."""
    total, cum, qs = sum(buckets), 0, {}
    lows, highs = [0.0, *BOUNDS], [*BOUNDS, math.inf]
    for pos, n in enumerate(buckets):
        for q in rollup.QUANTILES:
            pct = round(q * 100)
            if q not in qs and total > 0 and (cum + n) * 100 >= total * pct:
                a, b = lows[pos], highs[pos] if highs[pos] != math.inf else (hi or lows[pos])
                frac = (total * pct / 100 - cum) / n
                v = a * (b / a) ** frac if a > 0 and b > a else a + (b - a) * frac
                qs[q] = min(max(v, lo or 0.0), hi if hi is not None else math.inf)
        cum += n
    return {f"p{int(q * 100)}_s": qs.get(q) for q in rollup.QUANTILES}


def aggregate(rows, key):
    groups = {}
    for r in rows:
        g = groups.setdefault(key(r), {"counts": [0] * len(COUNTS), "peaks": defaultdict(int),
                                       "bytes": [0, 0], "buckets": [0] * (len(BOUNDS) + 1),
                                       "lo": [], "hi": []})
        g["counts"] = [a + r[c] for a, c in zip(g["counts"], COUNTS, strict=True)]
        g["buckets"] = [a + b for a, b in zip(g["buckets"], r["latency_buckets"], strict=True)]
        # each row carries its provider's peak over the routing nodes (docs/history.md)
        at = (r["served_by"], r["window_start"])
        g["peaks"][at] = max(g["peaks"][at], r.get("provider_peak_in_flight",
                                                     r["peak_in_flight"]))
        g["bytes"] = [g["bytes"][0] + r["bytes_in"], g["bytes"][1] + r["bytes_out"]]
        g["lo"] += [r["latency_min_s"]] if r["latency_min_s"] is not None else []
        g["hi"] += [r["latency_max_s"]] if r["latency_max_s"] is not None else []
    out = {}
    for k, g in groups.items():
        c = dict(zip(COUNTS, g["counts"], strict=True))
        out[k] = {**c, "peak_in_flight": max(g["peaks"].values()), "bytes_in": g["bytes"][0],
                  "bytes_out": g["bytes"][1],
                  **quantiles(g["buckets"], min(g["lo"], default=None),
                              max(g["hi"], default=None)),
                  "failure_rate": (c["errors"] + c["ack_timeouts"] + c["response_timeouts"])
                  / c["calls"] if c["calls"] else None}
    return out


def minute(r):
    return int(math.floor(r["window_start"] / 60) * 60)


def fairness(rows):
    per_min = defaultdict(lambda: [0, []])
    busy = defaultdict(bool)          # (provider, rpc, node, minute): any call or peak
    windows = defaultdict(lambda: [math.inf, -math.inf])   # its windows' first start, last end
    for r in rows:
        g = per_min[(r["rpc"], r["provider"], minute(r))]
        g[0] += r["calls"]
        g[1].append(r["weight"])
        ends = windows[(r["rpc"], r["provider"], minute(r))]
        ends[0], ends[1] = min(ends[0], r["window_start"]), max(ends[1], r["window_end"])
        busy[(r["provider"], r["rpc"], r["served_by"], minute(r))] |= bool(
            r["calls"] or r["peak_in_flight"])
    recording = ({k[2] for k, b in busy.items() if not b}     # nodes writing presence rows
                 | {r["served_by"] for r in rows if r.get("provider_peak_in_flight") is not None})
    exact = {(r["rpc"], r["provider"]) for r in rows if r["served_by"] in recording}
    w = {k: statistics.fmean(v[1]) for k, v in per_min.items()}
    span, rpc_min = {}, defaultdict(int)
    for (rpc, prov, m), (calls, _) in per_min.items():
        s = span.setdefault((rpc, prov), {"first": m, "last": m, "ws": [], "calls": 0})
        s["first"], s["last"] = min(s["first"], m), max(s["last"], m)
        s["ws"].append(w[(rpc, prov, m)])
        s["calls"] += calls
        rpc_min[(rpc, m)] += calls
    expected, present_min, idle_min = defaultdict(float), defaultdict(int), defaultdict(int)
    for (rpc, m), n in rpc_min.items():
        present = {p: w.get((rpc, p, m), statistics.fmean(s["ws"]))
                   for (r, p), s in span.items() if r == rpc and s["first"] <= m <= s["last"]
                   and ((r, p) not in exact or (r, p, m) in per_min)}
        spans = {p: min(60.0, max(0.0, windows[(rpc, p, m)][1] - windows[(rpc, p, m)][0]))
                 for p in present if (rpc, p, m) in per_min}
        longest = max(spans.values(), default=0.0)
        there = {p: spans[p] / longest if (rpc, p) in exact and p in spans and longest else 1.0
                 for p in present}    # the part of the minute it was there
        raw = {p: there[p] * wp / (wp + sum(present[q] * there[q] for q in present if q != p))
               for p, wp in present.items()}
        for p in present:
            expected[(rpc, p)] += n * raw[p] / sum(raw.values())
            present_min[(rpc, p)] += 1
            idle_min[(rpc, p)] += per_min.get((rpc, p, m), [0])[0] == 0
    out = {}
    for rpc in {r for r, _ in span}:
        mine = {p: s for (r, p), s in span.items() if r == rpc}
        total = sum(s["calls"] for s in mine.values())
        ratios = {p: s["calls"] / expected[(rpc, p)] for p, s in mine.items()}
        mean = statistics.fmean(ratios.values())
        for p, s in mine.items():
            e, ratio = expected[(rpc, p)], ratios[p]
            flagged = (abs(ratio - 1) > findings.FAIR_TOLERANCE
                       and abs(s["calls"] - e) > findings.FAIR_Z * math.sqrt(e))
            out[(rpc, p)] = {"calls": s["calls"], "rpc_calls": total, "expected_calls": e,
                             "present_minutes": present_min[(rpc, p)],
                             "idle_minutes": idle_min[(rpc, p)],
                             "share": s["calls"] / total, "expected_share": e / total,
                             "ratio": ratio, "cv": statistics.pstdev(ratios.values()) / mean,
                             "max_over_mean": max(ratios.values()) / mean,
                             "took": ("more" if ratio > 1 else "less") if flagged else None}
        more = ",".join(sorted(p for (r, p), v in out.items() if r == rpc and v["took"] == "more"))
        for p in mine:
            out[(rpc, p)]["because_of"] = (more or None) if out[(rpc, p)]["took"] == "less" \
                else None
    return out


def outliers(per_provider):
    out = {}
    for (rpc, p), me in per_provider.items():
        others = [v for (r, q), v in per_provider.items() if r == rpc and q != p]
        p99s = [o["p99_s"] for o in others if o["p99_s"] is not None]
        if p99s and statistics.median(p99s) > 0 and me["p99_s"] is not None \
                and me["p99_s"] > findings.SLOW_FACTOR * statistics.median(p99s):
            out[(rpc, p, "slow")] = (me["p99_s"], statistics.median(p99s))
        if others:
            med = statistics.median(o["failure_rate"] for o in others)
            if me["failure_rate"] >= med + findings.FAIL_MARGIN and \
                    me["failure_rate"] >= findings.FAIL_FACTOR * med:
                out[(rpc, p, "failing")] = (me["failure_rate"], med)
    return out


def against_peers(rows):
    acc = defaultdict(lambda: [0, 0, 0.0, 0])
    for r in rows:
        a = acc[(r["rpc"], r["provider"], minute(r))]
        a[0] += r["calls"]
        a[1] += r["errors"] + r["ack_timeouts"] + r["response_timeouts"]
        a[2] += r["latency_sum_s"]
        a[3] += r["latency_sampled"]
    per = {k: {"calls": a[0], "failed": a[1], "lat_sum": a[2], "sampled": a[3],
               "lat": a[2] / a[3] if a[3] else None, "fr": a[1] / a[0] if a[0] else None}
           for k, a in acc.items()}
    by_minute = defaultdict(dict)
    for (rpc, p, m), v in per.items():
        by_minute[(rpc, m)][p] = v
    for (rpc, p, m), v in per.items():
        others = [o for q, o in by_minute[(rpc, m)].items() if q != p]
        for f in ("lat", "fr"):
            values = [o[f] for o in others if o[f] is not None]
            v["peers_" + f] = statistics.median(values) if values else None
    return per


def episodes(rows):
    per, newest = against_peers(rows), max(minute(r) for r in rows)
    bad = defaultdict(list)
    for (rpc, p, m), v in per.items():
        if (v["sampled"] >= episodes_mod.MIN_SAMPLED and (v["peers_lat"] or 0) > 0
                and v["lat"] > findings.SLOW_FACTOR * v["peers_lat"]):
            bad[(rpc, p, "slow")].append(m)
        if (v["failed"] >= episodes_mod.MIN_FAILED and v["peers_fr"] is not None
                and v["fr"] >= v["peers_fr"] + findings.FAIL_MARGIN
                and v["fr"] >= findings.FAIL_FACTOR * v["peers_fr"]):
            bad[(rpc, p, "failing")].append(m)
    out = []
    for (rpc, p, kind), ms in bad.items():
        runs = [[]]
        for m in sorted(ms):
            if runs[-1] and m - runs[-1][-1] > 60 * episodes_mod.GAP + 60:
                runs.append([])
            runs[-1].append(m)
        for run in runs:
            if len(run) < episodes_mod.MIN_MINUTES:
                continue
            vs = [per[(rpc, p, m)] for m in run]
            calls, failed = sum(v["calls"] for v in vs), sum(v["failed"] for v in vs)
            peers = statistics.median(v["peers_lat" if kind == "slow" else "peers_fr"]
                                      for v in vs)
            out.append({"rpc": rpc, "provider": p, "kind": kind, "start": run[0],
                        "end": run[-1] + 60, "bad_minutes": len(run), "calls": calls,
                        "peers_value": peers,
                        "value": (sum(v["lat_sum"] for v in vs) / sum(v["sampled"] for v in vs)
                                  if kind == "slow" else failed / calls),
                        "ongoing": run[-1] >= newest - 60 * episodes_mod.GAP})
    return out


def weights(rows, found):
    # each provider's "now": the newest minute of its serving nodes' own rows
    node_newest, served = defaultdict(int), defaultdict(set)
    for r in rows:
        node_newest[r["served_by"]] = max(node_newest[r["served_by"]], minute(r))
        served[(r["rpc"], r["provider"])].add(r["served_by"])
    newest = {k: max(node_newest[n] for n in nodes) for k, nodes in served.items()}
    since = {}
    for ep in found:
        key = (ep["rpc"], ep["provider"])
        if ep["ongoing"]:             # weighed on the episode alone
            since[key] = max(since.get(key, 0), ep["start"])
        elif ep["end"] - 60 <= newest[key] - 60 * findings.RECOVERED:
            since[key] = max(since.get(key, 0), ep["end"])
    acc = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        key = (r["rpc"], r["provider"])
        if minute(r) < since.get(key, 0):
            continue
        d = 0.5 ** (max(0, newest[key] - minute(r)) / HALF_LIFE)
        a = acc[(r["rpc"], r["provider"])]
        a[0] += d * r["calls"]
        a[1] += d * (r["errors"] + r["ack_timeouts"] + r["response_timeouts"])
        a[2] += d * r["latency_sum_s"]
        a[3] += d * r["latency_sampled"]
    recent = {k: (a[1] / a[0] if a[0] else None, a[2] / a[3] if a[3] else None)
              for k, a in acc.items()}
    score = {}
    for (rpc, p), (fail, lat) in recent.items():
        others = [v for (r, q), v in recent.items() if r == rpc and q != p]
        lats = [v[1] for v in others if v[1] is not None]
        speed = (min(1.0, findings.LATENCY_BAND * statistics.median(lats) / lat)
                 if lats and lat else 1.0)
        fails = [v[0] for v in others if v[0] is not None]
        excess = max(0.0, (fail or 0.0) - (statistics.median(fails) if fails else 0.0)
                     - findings.FAILURE_NOISE)
        score[(rpc, p)] = (1 - excess) ** findings.FAILURE_POWER * speed
    return {k: (s, max(findings.MIN_WEIGHT, round(s / max(v for (r, _), v in score.items()
                                                           if r == k[0]), 3)))
            for k, s in score.items()}


@pytest.fixture(scope="module")
def job(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job")
    history, out = tmp / "history", tmp / "out"
    n = generate(str(history), nodes=2, providers=4, rpcs=3, hours=1.5, window=10,
                 slow=("p2", "p1@20-35"), failing=("p3",), hogs=("p4",), seed=1)
    assert n > 1000
    with open(next(iter(glob.glob(f"{history}/**/*.jsonl", recursive=True))), "a") as f:
        f.write('{"schema_version": 99, "rpc": "x"}\nnot json at all\n')   # skipped, counted
    with pytest.MonkeyPatch.context() as patch:   # the rollup reaches the driver in
        patch.setattr(analysis, "PART_BYTES", 32 << 10)   # many parts
        written = analysis.analyze(spark, str(history), str(out), half_life=HALF_LIFE)
    rows = [r for r in history_rows(history) if r["schema_version"] == 1]
    assert len(rows) == n

    def table(name):
        return [r.asDict() for r in spark.read.parquet(f"{out}/{name}").collect()]
    return rows, written, table, out


def test_period_and_provider_tables_equal_the_reference(job):
    rows, written, table, _ = job
    assert written["rows_read"] == len(rows) + 2 and written["rows_skipped"] == 2
    first, last = min(r["window_start"] for r in rows), max(r["window_end"] for r in rows)
    for name, seconds in analysis.PERIODS.items():
        want = aggregate(rows, lambda r, s=seconds: (r["provider"], r["rpc"], r["served_by"],
                                                    int(math.floor(r["window_start"] / s) * s)))
        got = {(r["provider"], r["rpc"], r["served_by"], r["period_start"]): r
               for r in table(name)}
        assert written[name] == len(want) == len(got)
        for key, fields in want.items():
            for field, value in fields.items():
                assert got[key][field] == pytest.approx(value), (name, key, field)
            period = key[3]       # a partial first or last period: divided by its real span
            assert got[key]["calls_per_s"] == pytest.approx(
                fields["calls"] / (min(period + seconds, last) - max(period, first)))
    want = aggregate(rows, lambda r: (r["rpc"], r["provider"]))
    got = {(r["rpc"], r["provider"]): r for r in table("per_provider")}
    assert got.keys() == want.keys()
    for key, fields in want.items():
        for field, value in fields.items():
            assert got[key][field] == pytest.approx(value), ("per_provider", key, field)
    slow = [r for r in got.values() if r["provider"] == "p2"]
    assert slow and all(r["p50_s"] > got[(r["rpc"], q)]["p50_s"]
                        for r in slow for (rpc, q) in got if rpc == r["rpc"] and q != "p2")


def test_findings_equal_the_reference_and_flag_what_was_injected(job):
    rows, _, table, _ = job
    want = fairness(rows)
    got = {(r["rpc"], r["provider"]): r for r in table("fairness")}
    assert got.keys() == want.keys()
    for key, fields in want.items():
        for field, value in fields.items():
            assert got[key][field] == (pytest.approx(value) if field != "because_of"
                                       else value), ("fairness", key, field)
    took = {k: v["took"] for k, v in want.items() if v["took"]}
    assert took and all(p == "p4" and t == "more" for (_, p), t in took.items() if t == "more")

    per_provider = aggregate(rows, lambda r: (r["rpc"], r["provider"]))
    want = outliers(per_provider)
    got = {(r["rpc"], r["provider"], r["kind"]): (r["value"], r["peers_median"])
           for r in table("outliers")}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value)
    # p1's 15 slow minutes show in its whole-span p99 too; the report lists the episode
    assert {(p, k) for _, p, k in got} == {("p1", "slow"), ("p2", "slow"), ("p3", "failing")}

    calls = defaultdict(int)
    per_minute = defaultdict(int)
    for r in rows:
        calls[r["rpc"]] += r["calls"]
        per_minute[(r["rpc"], minute(r))] += r["calls"]
    got = {r["rpc"]: r for r in table("hot_rpcs")}
    ranked = sorted(calls, key=lambda k: (-calls[k], k))
    shares = {rpc: n / sum(calls.values()) for rpc, n in calls.items()}
    for rpc, n in calls.items():
        share = shares[rpc]
        others = statistics.median(v for r, v in shares.items() if r != rpc)
        hot = share > 1 / len(calls) and share >= findings.HOT_FACTOR * others
        assert (got[rpc]["calls"], got[rpc]["rank"], got[rpc]["hot"]) == \
            (n, ranked.index(rpc) + 1, hot)
        assert got[rpc]["share"] == pytest.approx(share)
    first, last = min(r["window_start"] for r in rows), max(r["window_end"] for r in rows)

    def rate(m, v):      # a partial first or last minute is divided by its real span
        return v / (min(m + 60, last) - max(m, first))
    for rpc in calls:    # both peak columns are of one minute: the busiest, by rate
        m, v = min(((m, v) for (r, m), v in per_minute.items() if r == rpc),
                   key=lambda mv: (-rate(*mv), -mv[1], mv[0]))
        assert (got[rpc]["peak_minute_calls"], got[rpc]["peak_minute_calls_per_s"]) == (
            v, pytest.approx(rate(m, v)))
    for (_, m), v in list(per_minute.items()):
        per_minute[("*", m)] += v
    got = {(r["rpc"], r["rank"]): (r["minute"], r["calls"]) for r in table("peak_minutes")}
    for rpc in [*calls, "*"]:
        top = sorted(((m, v) for (r, m), v in per_minute.items() if r == rpc),
                     key=lambda mv: (-rate(*mv), -mv[1], mv[0]))[:findings.PEAKS]
        assert [got[(rpc, i + 1)] for i in range(len(top))] == top

    found = episodes(rows)
    got = {(r["rpc"], r["provider"], r["kind"], r["start"]): r for r in table("episodes")}
    assert got.keys() == {(e["rpc"], e["provider"], e["kind"], e["start"]) for e in found}
    for e in found:
        g = got[(e["rpc"], e["provider"], e["kind"], e["start"])]
        for field, value in e.items():
            assert g[field] == pytest.approx(value), ("episodes", e, field)
    # p1 was slow from minute 20 to 35 only: one episode there, over long before the end
    p1 = [e for e in found if e["provider"] == "p1"]
    assert p1 and all(e["kind"] == "slow" and not e["ongoing"] for e in p1)
    assert all(abs(e["start"] - (1_793_000_000 + 20 * 60)) <= 120 for e in p1)
    assert {(e["provider"], e["kind"]) for e in found if e["ongoing"]} == {
        ("p2", "slow"), ("p3", "failing")}

    want = weights(rows, found)
    got = {(r["rpc"], r["provider"]): r for r in table("weights")}
    assert got.keys() == want.keys()
    for key, (score, weight) in want.items():
        assert got[key]["score"] == pytest.approx(score)
        assert got[key]["weight"] == pytest.approx(weight, abs=0.0011)
    # slow: on svc1 its one peer, p1, was slow for a while too (weighed, decayed: 2x p1's)
    assert all(w["weight"] < 0.4 for w in got.values() if w["provider"] == "p2")
    assert all(w["weight"] < 0.6 for w in got.values() if w["provider"] == "p3")   # failing
    assert all(w["weight"] == 1.0 for w in got.values() if w["provider"] == "p1")  # recovered


def test_the_weights_file_loads_in_a_node_and_the_report_says_what_was_found(job):
    _, _, table, out = job
    loaded = load_weights(f"{out}/weights.json")
    for w in table("weights"):
        assert loaded.of(w["rpc"], w["provider"]) == w["weight"]
    report = (out / "report" / "report.html").read_text()
    for chart in ("throughput", "latency", "fairness", "heatmap"):
        assert (out / "report" / f"{chart}.png").stat().st_size > 5000
        assert f"alt='{chart}' src='data:image/png;base64," in report
    assert "<b>p2</b> is slow on" in report and "<b>p3</b> is failing on" in report
    assert "<b>p4</b> took more than its share" in report
    assert "Its peers took less as a result: p" in report and "took less than" not in report
    assert "2 skipped" in report


def test_histories_at_the_edges_run_and_say_what_they_hold(spark, tmp_path):
    """An rpc with no finished call (rows of calls 0: calls still running), two rpcs at
    97 % / 3 %, a node-hour file copied twice, a history with no usable row, no history."""
    from pyspark.errors import PySparkException

    history = tmp_path / "history"
    part = history / "date=2026-11-19" / "hour=10"
    rows = [history_row(w, rpc, p, calls) for w in range(12) for p in ("p1", "p2")
            for rpc, calls in (("busy", 485), ("rare", 15), ("idle", 0))]
    write_rows(part / "node=n1" / "part-1.jsonl", rows)
    write_rows(part / "node=n1" / "copy-of-part-1.jsonl", rows[:30])
    written = analysis.analyze(spark, str(history), str(tmp_path / "out"), report=True)
    assert (written["rows_read"], written["rows_duplicate"]) == (len(rows) + 30, 30)

    def table(name):
        return {(r["rpc"], r.asDict().get("provider")): r.asDict()
                for r in spark.read.parquet(str(tmp_path / "out" / name)).collect()}
    per_provider = table("per_provider")
    assert per_provider[("busy", "p1")]["calls"] == 12 * 485        # the copy counted once
    assert per_provider[("idle", "p1")]["calls"] == 0
    fair = table("fairness")
    assert fair[("idle", "p1")]["share"] is None and fair[("idle", "p1")]["took"] is None
    hot = {rpc: r["hot"] for (rpc, _), r in table("hot_rpcs").items()}
    assert hot == {"busy": True, "rare": False, "idle": False}
    report = (tmp_path / "out" / "report" / "report.html").read_text()
    assert "30 exact copies of another row (a file" in report and "<b>busy</b> is hot" in report

    junk = tmp_path / "junk"
    write_rows(junk / "part.jsonl", [{"schema_version": 99, "rpc": "x"}])
    with pytest.raises(analysis.NothingToAnalyse, match="no usable history rows"):
        analysis.analyze(spark, str(junk), str(tmp_path / "out2"))
    with pytest.raises(analysis.NothingToAnalyse, match="in the span asked for"):
        analysis.analyze(spark, str(history), str(tmp_path / "out2"), since=2e9)
    missing = f"file://{tmp_path}/nowhere"
    with pytest.raises(PySparkException) as caught:
        analysis.analyze(spark, missing, str(tmp_path / "out3"))
    assert analysis._spark_error(caught.value, missing) == (
        f"no history at {missing}: give the nodes' history directory (history.dir)")


def test_a_restart_is_not_taken_for_a_copy_and_a_copied_file_is_found(spark, tmp_path,
                                                                      monkeypatch):
    """A node restarted inside a minute files that minute's rows in two files, as a copied
    file does. The rollup flags the minute, only its hour is read again and its rows
    compared: nothing is there twice, so the history is rolled up once. A copied file's
    rows are found, and the rollup made again counts them once."""
    from pyspark.sql import functions as F

    rollups, hours_read = [], []
    once, read = analysis._rollup_once, analysis.read_history
    monkeypatch.setattr(analysis, "_rollup_once", lambda *args: (
        rollups.append(args), once(*args))[1])
    monkeypatch.setattr(analysis, "read_history", lambda *args: (
        hours_read.append(args[-1]), read(*args))[1])
    history = tmp_path / "history"
    day = history / "date=2026-11-18"           # the rows' hour: 1_795_000_000 is 11:06:40
    rows = [{**history_row(w, "r", "p1", 40), "routed_by": routed}
            for w in range(6) for routed in ("n1", "n2")]
    node = day / "hour=11" / "node=n1"
    write_rows(node / "part-1795000000-100.jsonl", rows[:8])        # windows 0-3, then
    write_rows(node / "part-1795000040-200.jsonl", rows[8:])        # restarted at 11:07:20
    write_rows(day / "hour=12" / "node=n1" / "part.jsonl", [history_row(400, "r", "p1", 1)])
    written = analysis.analyze(spark, str(history), str(tmp_path / "out"), report=False)
    assert (written["rows_read"], written["rows_duplicate"], len(rollups)) == (13, 0, 1)
    assert hours_read == [None, {1_795_000_000 - 400}]       # everything, then hour 11 only

    def calls():
        return spark.read.parquet(str(tmp_path / "out" / "per_provider")).agg(
            F.sum("calls")).collect()[0][0]
    assert calls() == 13 * 40 - 39

    write_rows(node / "copy-of-part-1795000040-200.jsonl", rows[8:])
    written = analysis.analyze(spark, str(history), str(tmp_path / "out"), report=False)
    assert (written["rows_read"], written["rows_duplicate"], len(rollups)) == (17, 4, 3)
    assert calls() == 13 * 40 - 39                                # the copy counted once


def test_a_chart_shows_every_flagged_provider_however_few_calls_it_got():
    from rpcbus.analytics import report

    rows = [{"rpc": "r", "provider": f"p{i:02}", "calls": 1000 - i} for i in range(60)]
    shown = report._busiest(rows, {("r", "p59"), ("r", "p58")})
    names = [r["provider"] for r in shown]
    assert len(shown) == report.TOP and {"p59", "p58", "p00"} <= set(names)
    assert names == sorted(names) and "p30" not in names


def test_an_out_that_is_not_local_is_written_through_hadoop(spark, tmp_path, monkeypatch):
    """``--out`` on hdfs:// or s3a:// is written through Hadoop's FileSystem in the driver's
    JVM: the per-period tables (a part at a time), the small ones and weights.json. Here a
    file:// path is taken for a remote one, so Hadoop's local FileSystem does the writing."""
    import numpy as np

    from rpcbus.analytics import files

    monkeypatch.setattr(files, "_local", lambda path: False)
    out = f"file://{tmp_path}/out"
    big = files.TableFile(spark, f"{out}/per_minute", "rpc STRING, calls BIGINT")
    big.add({"rpc": ["a", "b"], "calls": np.array([1.0, np.nan])})
    big.add({"rpc": ["c"], "calls": np.array([3.0])})
    assert big.close() == 3
    files.write_table(spark, f"{out}/fairness", [{"rpc": "x", "calls": 4}],
                      "rpc STRING, calls BIGINT")
    files.write_text(spark, f"{out}/weights.json", "{}\n")
    assert sorted((r.rpc, r.calls) for r in spark.read.parquet(f"{out}/per_minute").collect()
                  ) == [("a", 1), ("b", None), ("c", 3)]
    assert [tuple(r) for r in spark.read.parquet(f"{out}/fairness").collect()] == [("x", 4)]
    assert {files.PART, "_SUCCESS"} <= set(os.listdir(tmp_path / "out" / "per_minute"))
    assert (tmp_path / "out" / "weights.json").read_text() == "{}\n"
    gone = files.TableFile(spark, f"{out}/per_hour", "rpc STRING")
    gone.add({"rpc": ["y"]})
    gone.abort()                  # an error before close: its temporary file is gone too
    assert not os.path.exists(gone._file) and not (tmp_path / "out" / "per_hour").exists()
