"""What an operator most needs from the analysis, on constructed histories: a short slow
episode inside a day (when, how bad; its weight recovers), a starved provider, a node
whose clock is off, the in-flight peak over routing nodes, percentiles that read true,
weights that ignore noise, and --since/--until reading only the hours they name."""

import json

import pytest

from rpcbus.analytics import analysis
from rpcbus.analytics.historygen import generate
from rpcbus.broker.rpcstats import BOUNDS, bucket_of

from .conftest import PYSPARK_WARNINGS, history_row, write_rows

pytestmark = PYSPARK_WARNINGS
START = 1_793_000_000       # historygen's first window (a fixed instant)


def tables(spark, out, *names):
    return [[r.asDict() for r in spark.read.parquet(f"{out}/{n}").collect()] for n in names]


def test_a_day_with_a_ten_minute_slow_spell_a_starved_provider_and_a_clock_90_s_ahead(
        spark, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    # seed 9: svc1.call is served by p1 (on n1), p2 (n2) and p3 (n3)
    generate(str(history), nodes=3, providers=4, rpcs=1, hours=24, window=60, seed=9,
             slow=("p1@600-610",), starved=("p2",), skew={"n3": 90})
    analysis.analyze(spark, str(history), str(out))
    episodes, outliers, fairness, weights, skew = tables(
        spark, out, "episodes", "outliers", "fairness", "weights", "clock_skew")

    [spell] = episodes          # found inside the day, with when and how bad
    assert (spell["provider"], spell["kind"], spell["ongoing"]) == ("p1", "slow", False)
    assert abs(spell["start"] - (START + 600 * 60)) <= 120 and 8 <= spell["minutes"] <= 12
    assert spell["factor"] > 5
    assert not outliers                          # 10 minutes of a day: no whole-span outlier
    assert {w["provider"]: w["weight"] for w in weights} == {"p1": 1.0, "p2": 1.0, "p3": 1.0}
    assert [w["recovered_at"] for w in weights if w["provider"] == "p1"] == [spell["end"]]

    starved = {f["provider"]: f for f in fairness}["p2"]
    assert starved["took"] == "less" and starved["calls"] < starved["expected_calls"] / 100
    assert starved["idle_minutes"] >= starved["present_minutes"] - 1 >= 1400

    [n3] = skew
    assert (n3["node"], n3["offset_s"]) == ("n3", 90.0) and "ends" in n3["method"]

    report = (out / "report" / "report.html").read_text()
    findings = report[report.index("<h2>Findings"):report.index("</ul>")]
    lines = findings.split("<li>")[1:]
    assert lines[0].startswith("<b>Clock skew:</b> node <b>n3</b> looks 1.5 min ahead")
    assert "<b>p2</b> is starved on <b>svc1.call</b>" in findings
    assert "Its calls went to p1, p3." in findings and "took more" not in findings
    assert "<b>p1</b> was slow on <b>svc1.call</b> for a while" in findings
    assert "then recovered" in findings and "Nothing stands out" not in findings
    assert "(24 h)" in report and "the cluster's real span is shorter" in report


def test_peaks_percentiles_noise_and_the_hours_read(spark, tmp_path):
    history = tmp_path / "history"
    rows = []
    for w in range(30):
        for routed_by in ("n1", "n2", "n3"):       # 4 in flight from each routing node,
            r = history_row(w, "a", "p1", 40)      # 10 at once over the three (11 once)
            r.update(routed_by=routed_by, peak_in_flight=4,
                     provider_peak_in_flight=11 if w == 7 else 10)
            rows.append(r)
            old = history_row(w, "a", "p0", 40)    # a node before 0.2: no provider peak
            old.update(routed_by=routed_by, peak_in_flight=5 if w == 3 else 4)
            del old["provider_peak_in_flight"]
            rows.append(old)
        exact = history_row(w, "b", "steady", 16)  # every sampled call took 50.7 ms
        exact["latency_buckets"] = [0] * (len(BOUNDS) + 1)
        exact["latency_buckets"][bucket_of(0.0507)] = 2
        exact.update(latency_sampled=2, latency_sum_s=0.1014, latency_min_s=0.0507,
                     latency_max_s=0.0507)
        rows.append(exact)
        # the last minute (windows 26-29, 40 s of it in the span) is the busiest by rate
        # (120 calls, 3/s), the full ones the fullest (150 calls, 2.5/s)
        rows.append(history_row(w, "d", "p9", 30 if w >= 26 else 25))
        for provider, mean in (("quick", 0.000260), ("less-quick", 0.000288)):  # noise
            r = history_row(w, "c", provider, 160)
            r["latency_buckets"] = [0] * (len(BOUNDS) + 1)
            r["latency_buckets"][bucket_of(mean)] = 10
            r.update(latency_sampled=10, latency_sum_s=10 * mean)
            rows.append(r)
    day = history / "date=2026-11-18"          # the rows' hour: 1_795_000_000 is 11:06:40
    write_rows(day / "hour=11" / "node=n1" / "part.jsonl", rows)
    for other in ("hour=10", "hour=12"):                  # junk outside the span asked for
        write_rows(day / other / "node=n1" / "part.jsonl", [{"schema_version": 99}])
    since, until = 1_795_000_000 - 60, 1_795_000_000 + 600
    assert [f.rsplit("/", 2)[-2:] for f in analysis.hour_folders(
        spark, str(history), since, until)] == [["date=2026-11-18", "hour=11"]]
    written = analysis.analyze(spark, str(history), str(tmp_path / "out"), since, until)
    assert written["rows_skipped"] == 0                   # hours 10 and 12 were not read
    doc = json.loads((tmp_path / "out" / "report" / "findings.json").read_text())
    assert {"episodes", "clock_skew", "weights", "fairness"} <= doc.keys()
    assert doc["clock_skew"] == []

    per_provider, weights, hot = tables(spark, tmp_path / "out", "per_provider", "weights",
                                        "hot_rpcs")
    busiest = {r["rpc"]: (r["peak_minute_calls"], r["peak_minute_calls_per_s"]) for r in hot}
    assert busiest["d"] == (120, pytest.approx(3.0))     # both of one minute
    got = {r["provider"]: r for r in per_provider}
    assert got["p1"]["peak_in_flight"] == 11         # the provider's, over its routing nodes
    assert got["p0"]["peak_in_flight"] == 5          # without it, the most of one node's
    assert got["steady"]["p50_s"] == got["steady"]["p99_s"] == pytest.approx(0.0507)
    assert {w["provider"]: w["weight"] for w in weights if w["rpc"] == "c"} == {
        "quick": 1.0, "less-quick": 1.0}


def test_local_first_shares_are_judged_within_each_node(spark, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    # seed 5, 2 nodes: svc1.call is served by p1, p3 (on n1) and p6 (n2); svc2.call by
    # p1 (n1), p2 and p6 (n2). n2's callers make twice n1's calls, and each node's calls
    # stay on its providers: p6 takes most of svc1 by the policy, not unfairly. p2 is
    # slow, and the policy gives it a tenth of its share beside p6: by design, too.
    generate(str(history), nodes=2, providers=6, rpcs=2, hours=0.5, window=30, seed=5,
             hogs=("p3",), slow=("p2",), policy="local-first")
    analysis.analyze(spark, str(history), str(out))
    fairness, outliers = tables(spark, out, "fairness", "outliers")
    got = {(f["rpc"], f["provider"]): f for f in fairness}

    p6 = got[("svc1.call", "p6")]
    assert p6["share"] > 0.5 and p6["among"] == "n2" and p6["took"] is None
    hog, peer = got[("svc1.call", "p3")], got[("svc1.call", "p1")]
    assert (hog["took"], hog["among"]) == ("more", "n1")
    assert (peer["took"], peer["because_of"]) == ("less", "p3")
    assert hog["expected_share"] == pytest.approx(0.5, abs=0.05)   # of n1's calls
    assert {(o["rpc"], o["provider"], o["kind"]) for o in outliers} >= {
        ("svc2.call", "p2", "slow")}
    slow = got[("svc2.call", "p2")]
    assert slow["calls"] < got[("svc2.call", "p6")]["calls"] / 5 and slow["among"] == "n2"
    assert not [f for f in fairness if f["rpc"] == "svc2.call" and f["took"]]

    report = (out / "report" / "report.html").read_text()
    findings = report[report.index("<h2>Findings"):report.index("</ul>")]
    assert ("<b>p3</b> took more than its share of <b>svc1.call</b> among the providers on "
            "n1 (policy local-first)") in findings
    assert "p6" not in findings and "took less than its share of <b>svc2" not in findings
