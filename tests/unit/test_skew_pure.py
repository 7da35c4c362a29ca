"""Clock skew from the nodes' rows (analytics/skew.py, pure): the node that is off is named
with its offset; nodes that merely joined late, or agree, are not."""

import random

from rpcbus.analytics import skew

T0 = 1_793_000_000 - 1_793_000_000 % 60


def nodes(*offsets, spans=None):
    """Nodes whose calls per minute follow one cluster-wide load (each with a little noise
    of its own), stamped by clocks ``offsets`` seconds off."""
    rng = random.Random(3)
    load = [rng.lognormvariate(0, 0.4) for _ in range(240)]
    out = {}
    for i, offset in enumerate(offsets):
        minutes = (spans or {}).get(i, range(120))
        shift = offset - offset % 60           # rows are filed per minute of their own clock
        out[f"n{i + 1}"] = {
            "first": T0 + minutes[0] * 60 + offset, "last": T0 + (minutes[-1] + 1) * 60 + offset,
            "calls": {T0 + m * 60 + shift: int(1000 * load[m] * rng.uniform(0.9, 1.1))
                      for m in minutes}}
    return out


def test_the_node_an_hour_ahead_or_90_s_ahead_is_named_and_only_it():
    [found] = skew.find(nodes(0, 0, 3600))
    assert (found["node"], found["offset_s"], found["method"]) == ("n3", 3600.0, "ends+load")
    [found] = skew.find(nodes(0, 90, 0, 0))
    assert (found["node"], found["offset_s"]) == ("n2", 90.0)
    [found] = skew.find(nodes(-600, 0, 0))
    assert (found["node"], found["offset_s"]) == ("n1", -600.0)


def test_two_nodes_have_no_majority_the_finding_names_both():
    [found] = skew.find(nodes(0, 120))
    assert (found["node"], found["relative_to"], found["offset_s"]) == ("n2", "n1", 120.0)


def test_agreeing_clocks_and_a_node_that_joined_late_raise_nothing():
    assert skew.find(nodes(0, 0, 0)) == []
    assert skew.find(nodes(0, 0, 0, spans={2: range(30, 90)})) == []
    assert skew.find(nodes(0, 30)) == []                 # under a minute: not reported
    assert skew.find(nodes(0)) == []


def test_a_node_that_worked_one_minute_then_idled_is_not_lined_up_with_a_busy_minute():
    for span in (range(30), range(60), range(120)):
        found = nodes(0, 0, spans={0: span, 1: span})
        first = min(found["n2"]["calls"])
        # n2's only provider was starved after its first minute: presence rows, 0 calls
        found["n2"]["calls"] = {m: (5000 if m == first else 0) for m in found["n2"]["calls"]}
        assert skew.find(found) == [], len(span)


def test_ends_that_agree_outweigh_loads_that_line_up_at_a_lag():
    """Two rpcs, 97 % and 3 % of the calls, served on two nodes that ran over the same
    span: bursts of one line up with the other's at a 99-minute lag over the 22 minutes
    the shifted series share, which once made "n1 looks 1.65 h behind"."""
    found = nodes(0, 0, spans={0: range(121), 1: range(121)})
    bursts = [m for m in range(121) if m % 11 == 0]
    found["n1"]["calls"] = {T0 + m * 60: (900 if m in bursts else 30) for m in range(121)}
    found["n2"]["calls"] = {T0 + m * 60: (28 if (m + 99) % 121 in bursts else 1)
                            for m in range(121)}
    assert skew.find(found) == []
    # the same loads on nodes whose ends tell nothing (n2 ran over a third of the span):
    # n2's minutes there are flat, which correlates with nothing (it once "did", as NaN)
    found["n2"] = {"first": T0 + 80 * 60, "last": T0 + 121 * 60,
                   "calls": {t: c for t, c in found["n2"]["calls"].items() if t >= T0 + 80 * 60}}
    assert skew.find(found) == []


def clocks(leap=None, pause=None, spans=None, nodes_=3, minutes=120, seed=5):
    """``leaps``' input: nodes whose calls per minute follow one load, with 6 windows of
    10 s a minute; ``leap`` (node, minute, seconds): that node's clock steps forward by
    ``seconds`` at that minute; ``pause`` (node, first, last): that node writes nothing
    in those minutes (its clock right)."""
    rng = random.Random(seed)
    load = [rng.lognormvariate(0, 0.4) for _ in range(minutes)]
    out = {}
    for i in range(nodes_):
        node = f"n{i + 1}"
        mine = {}
        for m in (spans or {}).get(node, range(minutes)):
            if pause and pause[0] == node and pause[1] <= m < pause[2]:
                continue
            t = T0 + m * 60
            if leap and leap[0] == node and m >= leap[1]:
                t += leap[2]
            minute = int(t // 60 * 60)
            mine[minute] = (int(1000 * load[m] * rng.uniform(0.9, 1.1)), t, t + 60.0)
        out[node] = mine
    return out


def test_a_clock_that_stepped_an_hour_ahead_mid_history_is_named_with_when():
    [leap] = skew.leaps(clocks(leap=("n3", 60, 3600)))
    assert leap["node"] == "n3" and leap["method"] == "ends+load", leap
    assert (leap["offset_s"], leap["shift_s"]) == (3600.0, 3600.0)
    assert leap["since"] == T0 + 60 * 60                   # the end of its last row before
    assert leap["from_minute"] == T0 + 60 * 60 + 3600      # its first row after, stamped
    # two nodes: the one whose rows have the gap stepped
    [leap] = skew.leaps(clocks(leap=("n1", 30, 1800), nodes_=2))
    assert (leap["node"], leap["offset_s"]) == ("n1", 1800.0)
    # near the end there is too little load after it to compare: the ends tell
    [leap] = skew.leaps(clocks(leap=("n2", 115, 600)))
    assert (leap["node"], leap["method"]) == ("n2", "ends")
    # a step of 95 s: moved back by whole minutes (its rows are filed per minute)
    [leap] = skew.leaps(clocks(leap=("n2", 40, 95)))
    assert (leap["offset_s"], leap["shift_s"]) == (95.0, 120.0)


def test_a_node_that_paused_or_a_cluster_that_stopped_has_no_leap():
    assert skew.leaps(clocks()) == []
    # n2 wrote nothing for half an hour, its clock right: its load after lines up unmoved
    assert skew.leaps(clocks(pause=("n2", 40, 70))) == []
    # n2 wrote nothing for its last hour and came back for 3 minutes at the end: the
    # ends agree with the cluster's, too few minutes to compare the load
    assert skew.leaps(clocks(pause=("n2", 50, 117))) == []
    # everyone stopped for an hour (the same gap on every node): nothing to tell
    both = clocks(pause=("n1", 40, 100))
    both["n2"] = {m: v for m, v in both["n2"].items() if not T0 + 2400 <= m < T0 + 6000}
    both["n3"] = {m: v for m, v in both["n3"].items() if not T0 + 2400 <= m < T0 + 6000}
    assert skew.leaps(both) == []
    # a node that joined late, or left early, has no gap
    assert skew.leaps(clocks(spans={"n3": range(30, 120), "n2": range(0, 70)})) == []


def test_two_steps_of_one_clock_are_both_taken_back():
    data = clocks(leap=("n3", 30, 1200))
    later = {m + 1800 if m >= T0 + 80 * 60 + 1200 else m:
             (c, s + 1800, e + 1800) if m >= T0 + 80 * 60 + 1200 else (c, s, e)
             for m, (c, s, e) in data["n3"].items()}
    data["n3"] = later
    found = skew.leaps(data)
    assert [(f["node"], f["offset_s"]) for f in found] == [("n3", 1200.0), ("n3", 1800.0)]
