"""Histories on which the analysis once misled an operator: each provider judged on its
own node's timeline (a node's clock an hour ahead moves no one else's "now"), a slowdown
still going or lasting a whole life lowers the weight, the weight in use and since when,
and a node or provider that went silent."""

import json

import pytest

from rpcbus.analytics import analysis
from rpcbus.analytics.historygen import generate

from .conftest import PYSPARK_WARNINGS, history_row, write_rows
from .test_operator_findings import tables

pytestmark = PYSPARK_WARNINGS
T0 = 1_795_000_000          # history_row's first window


def findings_said(out):
    report = (out / "report" / "report.html").read_text()
    return report[report.index("<h2>Findings"):report.index("</ul>")], report


def test_a_whole_life_slowdown_beside_a_clock_an_hour_ahead_lowers_the_weight(
        spark, tmp_path):
    history, out = tmp_path / "history", tmp_path / "out"
    # seed 9: svc1.call is served by p1 (on n1), p2 (n2) and p3 (n3); p1 ~10x slower
    generate(str(history), nodes=3, providers=4, rpcs=1, hours=2, window=60, seed=9,
             slow=("p1",), skew={"n3": 3600})
    analysis.analyze(spark, str(history), str(out))
    episodes, weights, skew = tables(spark, out, "episodes", "weights", "clock_skew")
    [n3] = skew
    assert (n3["node"], n3["offset_s"]) == ("n3", 3600.0)
    slow = [e for e in episodes if e["provider"] == "p1"]
    assert slow and all(e["kind"] == "slow" for e in slow) and slow[-1]["ongoing"]
    got = {w["provider"]: w for w in weights}
    assert got["p1"]["weight"] < 0.5 and got["p1"]["recovered_at"] is None
    assert got["p2"]["weight"] == got["p3"]["weight"] == 1.0
    said, report = findings_said(out)
    assert "<b>p1</b> is slow on <b>svc1.call</b>" in said
    assert "Recommended weight" in said and "No weight would change" not in report


def test_an_ongoing_slowdown_a_changed_weight_and_silent_nodes_and_providers(
        spark, tmp_path):
    """Two hours of 10 s windows, one rpc: a on n1, b on n2 (its weight set from 1 to 0.25
    at the hour; from then on it fails 0.5 % of its calls, within the noise a weight
    ignores, so no failure rate is given as a reason for its weight), c on n3 (10x slower
    for the last 10 minutes), d on n1 (gone after 80 minutes, n1 going on), e on n4 (n4
    writes nothing after 60 minutes)."""
    rows = {}

    def row(w, provider, node, calls=40, weight=1.0, slow=False, errors=0):
        r = history_row(w, "svc", provider, calls, node)
        r.update(weight=weight, latency_sum_s=r["latency_sampled"] * (0.02 if slow else 0.002),
                 errors=errors, ok=calls - errors)
        hour = 11 + int(r["window_start"] - (T0 - 400)) // 3600    # T0 is 11:06:40
        rows.setdefault((hour, node), []).append(r)
    for w in range(720):
        row(w, "a", "n1", calls=0 if 8 <= w < 14 else 40)     # a minute of presence rows
        row(w, "b", "n2", weight=0.25 if w >= 360 else 1.0, calls=10 if w >= 360 else 40,
            errors=1 if w >= 360 and w % 20 == 0 else 0)
        row(w, "c", "n3", slow=w >= 660)
        if w < 480:
            row(w, "d", "n1")
        if w < 360:
            row(w, "e", "n4")
    for (hour, node), mine in rows.items():    # files per node and hour, as nodes write
        write_rows(tmp_path / "history" / "date=2026-11-18" / f"hour={hour}"
                   / f"node={node}" / "part.jsonl", mine)
    out = tmp_path / "out"
    analysis.analyze(spark, str(tmp_path / "history"), str(out))
    episodes, weights, silent, skew = tables(spark, out, "episodes", "weights", "silent",
                                             "clock_skew")
    assert skew == []
    [c] = [e for e in episodes if e["provider"] == "c"]
    assert (c["kind"], c["ongoing"]) == ("slow", True) and 8 <= c["minutes"] <= 11
    got = {w["provider"]: w for w in weights}
    assert got["c"]["weight"] < 0.5                    # judged on the slowdown: now
    b = got["b"]
    assert (b["current"], b["previous"]) == (0.25, 1.0) and b["weight"] == 1.0
    assert b["current_since"] == T0 + 3600 - (T0 + 3600) % 60
    found = {(s["kind"], s["name"]): s for s in silent}
    assert set(found) == {("node", "n4"), ("provider", "d")}
    assert found[("node", "n4")]["since"] == T0 + 3600
    assert found[("node", "n4")]["silent_s"] == pytest.approx(3600, abs=60)
    assert found[("provider", "d")]["node"] == "n1"
    assert found[("provider", "d")]["silent_s"] == pytest.approx(2400, abs=120)

    said, _ = findings_said(out)
    assert "<b>Silent:</b> node <b>n4</b> wrote no history after" in said
    assert "<b>d</b> went silent on <b>svc</b> (node n1)" in said
    assert "(now 0.25, set at 2026-11-18 12:06 UTC; 1 before) for <b>b</b>" in said
    [b_said] = [line for line in said.split("<li") if "for <b>b</b>" in line]
    assert "it serves as well as its peers now" in b_said and "failure" not in b_said


def test_a_provider_connected_part_of_the_time_on_a_busy_node_blames_no_one(
        spark, tmp_path):
    """On n1, busy every minute (no presence row ever written): f is served by p3 and p4
    all along and by p5 only in the first 20 s of every other minute; h by p6 and p7 all
    along and by p8 in minutes 10-19, 30-39 and 50-59 only; k by p10 all along and by p9
    until minute 40, then never again. While all are there each gets an equal share.
    Presence judged from whole idle minutes, or from the first to the last minute with
    rows, once expected a whole minute's share of p5 and 50 minutes of p8, blamed their
    peers, and did not see p9 go silent (n1 wrote no presence row)."""
    rows = []
    for w in range(360):                                  # an hour of 10 s windows
        flapper = (w // 6) % 2 == 0 and w % 6 < 2
        for provider in ("p3", "p4", *(("p5",) if flapper else ())):
            rows.append(history_row(w, "f", provider, 20 if flapper else 30))
        part = (w // 60) % 2 == 1
        for provider in ("p6", "p7", *(("p8",) if part else ())):
            rows.append(history_row(w, "h", provider, 20 if part else 30))
        for provider in ("p10", *(("p9",) if w < 240 else ())):
            rows.append(history_row(w, "k", provider, 30 if w < 240 else 60))
    write_rows(tmp_path / "history" / "date=2026-11-18" / "hour=11" / "node=n1"
               / "part.jsonl", [r for r in rows if r["window_start"] < T0 - 400 + 3600])
    write_rows(tmp_path / "history" / "date=2026-11-18" / "hour=12" / "node=n1"
               / "part.jsonl", [r for r in rows if r["window_start"] >= T0 - 400 + 3600])
    out = tmp_path / "out"
    analysis.analyze(spark, str(tmp_path / "history"), str(out))
    fairness, silent = tables(spark, out, "fairness", "silent")
    got = {f["provider"]: f for f in fairness}
    assert not [f for f in got.values() if f["took"]], got
    assert got["p5"]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert got["p5"]["present_s"] == pytest.approx(30 * 20, abs=60)   # 30 minutes x 20 s
    assert got["p8"]["ratio"] == pytest.approx(1.0, abs=0.05)
    assert got["p8"]["present_s"] == pytest.approx(1800, abs=60)      # 30 whole minutes
    assert [(x["kind"], x["name"]) for x in silent] == [("provider", "p9")]
    assert silent[0]["silent_s"] == pytest.approx(1200, abs=120)
    said, _ = findings_said(out)
    assert "took more" not in said and "took less" not in said
    assert "<b>p9</b> went silent on <b>k</b> (node n1)" in said


def test_a_line_far_over_a_row_is_skipped_unread_and_counted(spark, tmp_path, capsys):
    """A 24 MB line among a node's rows (one of 300 MB once ran the JVM out of memory),
    and a file of nothing but a 2 MB line: each skipped unread, counted once, said
    once."""
    hour = tmp_path / "history" / "date=2026-11-18" / "hour=11"
    rows = [history_row(w, "svc", "a", 40) for w in range(200)]
    write_rows(hour / "node=n1" / "part.jsonl", rows)
    with open(hour / "node=n1" / "part.jsonl", "a") as f:
        f.write('{"schema_version": 1, "rpc": "' + "x" * (24 << 20) + '"}\n')
        f.write(json.dumps(history_row(200, "svc", "a", 40)) + "\n")   # read on after it
    (hour / "node=n2").mkdir()
    (hour / "node=n2" / "junk.jsonl").write_text("y" * (2 << 20) + "\n")
    written = analysis.analyze(spark, str(tmp_path / "history"), str(tmp_path / "out"),
                               report=False)
    assert (written["rows_read"], written["rows_skipped"]) == (203, 2)
    [said] = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert "2 history file(s) hold lines over 1 MiB" in said


def test_a_history_written_to_while_it_is_analysed_is_not_called_damaged(
        spark, tmp_path, capsys, monkeypatch):
    """A node appends to its file after the job read it (nodes write their history as it
    is analysed): the file's size now is not what its rows were read from, and no file is
    said to hold lines over 1 MiB (before: "1 history file(s) hold lines over 1 MiB ... a
    damaged or foreign file", its longest line 600 bytes)."""
    part = tmp_path / "history" / "date=2026-11-18" / "hour=11" / "node=n1" / "part.jsonl"
    write_rows(part, [history_row(w, "svc", f"p{w % 40}", 40) for w in range(4000)])
    big_files = analysis._big_files

    def written_meanwhile(*args):
        with open(part, "a") as f:   # what the node wrote since the job read the file
            f.writelines(json.dumps(history_row(4000 + w, "svc", "p1", 40)) + "\n"
                         for w in range(2000))
        return big_files(*args)
    monkeypatch.setattr(analysis, "_big_files", written_meanwhile)
    written = analysis.analyze(spark, str(tmp_path / "history"), str(tmp_path / "out"),
                               report=False)
    assert (written["rows_read"], written["rows_skipped"]) == (4000, 0)
    assert "warning" not in capsys.readouterr().out


def test_a_node_renamed_mid_history_is_said_to_have_moved_not_gone_silent(spark, tmp_path):
    """Two hours of 10 s windows: a on n1 all along; b and c on n2 for the first hour,
    then on n4 (n2 restarted under a new name), d on n3 until it stops at 80 minutes
    with its node. n2 once read as a node gone silent whose providers' figures end."""
    rows = {}

    def row(w, rpc, provider, node):
        r = history_row(w, rpc, provider, 40, node)
        hour = 11 + int(r["window_start"] - (T0 - 400)) // 3600    # T0 is 11:06:40
        rows.setdefault((hour, node), []).append(r)
    for w in range(720):
        row(w, "svc", "a", "n1")
        for provider in ("b", "c"):
            row(w, "svc", provider, "n2" if w < 360 else "n4")
        if w < 480:
            row(w, "other", "d", "n3")
    for (hour, node), mine in rows.items():
        write_rows(tmp_path / "history" / "date=2026-11-18" / f"hour={hour}"
                   / f"node={node}" / "part.jsonl", mine)
    out = tmp_path / "out"
    analysis.analyze(spark, str(tmp_path / "history"), str(out))
    silent, skew = tables(spark, out, "silent", "clock_skew")
    found = {(s["kind"], s["name"]): s for s in silent}
    assert set(found) == {("node", "n2"), ("node", "n3")}, (silent, skew)
    assert (found[("node", "n2")]["moved_to"], found[("node", "n2")]["moved_at"]) == (
        "n4", T0 + 3600)
    assert found[("node", "n3")]["moved_to"] is None           # nobody carried d on
    said, _ = findings_said(out)
    assert "<b>n2</b>'s providers moved to node <b>n4</b> at" in said
    assert "node <b>n2</b> wrote no history after" not in said
    assert "<b>Silent:</b> node <b>n3</b> wrote no history after" in said
    assert "went silent on" not in said                        # b and c carried on


def test_a_clock_that_stepped_an_hour_ahead_is_named_and_taken_back(spark, tmp_path):
    """Two hours, three nodes; n3's clock steps 1 h ahead at the hour, so its rows of the
    second hour are stamped as the third. That once read as n1 and n2 silent "1 h before
    the other nodes stopped", no clock named, n3's providers present 181 minutes."""
    history, out = tmp_path / "history", tmp_path / "out"
    start = 1_793_000_040.0                                  # a minute's start
    generate(str(history), nodes=3, providers=6, rpcs=4, hours=2, window=60, seed=4,
             start=start, skew={"n3": (3600.0, 60)})
    analysis.analyze(spark, str(history), str(out))
    skew, silent, fairness, per_minute = tables(spark, out, "clock_skew", "silent",
                                                "fairness", "per_minute")
    [n3] = skew
    assert (n3["node"], n3["offset_s"], n3["since"]) == ("n3", 3600.0, start + 3600), n3
    assert n3["last_window"] == start + 7200                 # its rows taken back
    assert silent == []
    assert max(r["period_start"] for r in per_minute) == start + 7200 - 60
    assert fairness and all(f["took"] is None and f["present_minutes"] <= 120
                            for f in fairness), fairness
    said, report = findings_said(out)
    assert said.split("<li>")[1].startswith("<b>Clock leap:</b> node <b>n3</b>'s clock "
                                            "stepped 1 h ahead at"), said
    assert "(2 h)" in report and "That span includes" not in report
