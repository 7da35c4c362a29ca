"""The bucketed deadline structure, with a fake clock."""

from hypothesis import given
from hypothesis import strategies as st

from rpcbus.deadlines import Deadlines


@given(st.lists(st.floats(0, 50, allow_nan=False), max_size=60), st.floats(0.001, 1))
def test_keys_never_fire_early_and_all_fire_by_their_time_plus_granularity(deadlines, gran):
    d = Deadlines(gran, now=0.0)
    for i, due in enumerate(deadlines):
        d.add(i, due)
    fired = []
    now = 0.0
    while now <= 52:
        for i in d.expire(now):
            due = deadlines[i]
            assert due <= now + 1e-9, "fired early"
            assert now - due <= gran + 0.25 + 1e-9, "fired too late"
            fired.append(i)
        now += 0.25
    assert sorted(fired) == list(range(len(deadlines)))
    assert len(d) == 0


def test_keys_come_back_once_in_slot_order():
    d = Deadlines(0.01, now=100.0)
    for i in (5, 1, 3, 1.5):
        d.add(i, 100.0 + i)
    assert d.expire(101.2) == [1]
    assert d.expire(101.2) == []
    assert d.expire(200.0) == [1.5, 3, 5]
    assert len(d) == 0


def test_past_deadlines_fire_at_the_next_slot_and_long_gaps_are_cheap():
    d = Deadlines(0.01, now=0.0)
    d.expire(5.0)
    d.add("late", 1.0)                   # already past
    assert d.expire(5.0) == []           # not early: slot after the last sweep
    assert d.expire(5.02) == ["late"]
    d.add("far", 10_000.0)
    assert d.expire(9_999.0) == []       # walks filled slots, not a million empty ones
    assert d.expire(10_000.0) == ["far"]


def test_a_swept_bucket_is_never_appended_to_again():
    d = Deadlines(1.0, now=0.0)
    d.add("a", 5.0)
    assert d.expire(5.0) == ["a"]
    d.add("b", 5.0)                      # same slot as the cached, swept one
    assert d.expire(6.0) == ["b"]
