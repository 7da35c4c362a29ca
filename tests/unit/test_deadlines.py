"""The bucketed deadline structure, with a fake clock."""

from hypothesis import given
from hypothesis import strategies as st

from clients.deadlines import Deadlines


@given(st.lists(st.floats(0, 50, allow_nan=False), max_size=60), st.floats(0.001, 1))
def test_items_never_fire_early_and_all_fire_by_their_time_plus_granularity(deadlines, gran):
    d = Deadlines(gran, now=0.0)
    for i, due in enumerate(deadlines):
        d.add(i, (i, due), due)
    fired = []
    now = 0.0
    while now <= 52:
        for i, due in d.expire(now):
            assert due <= now + 1e-9, "fired early"
            assert now - due <= gran + 0.25 + 1e-9, "fired too late"
            fired.append(i)
        now += 0.25
    assert sorted(fired) == list(range(len(deadlines)))
    assert len(d) == 0


def test_removed_items_leave_at_once_and_never_fire():
    d = Deadlines(0.01, now=100.0)
    slots = {i: d.add(i, i, 100.0 + i) for i in range(10)}
    for i in range(0, 10, 2):
        assert d.remove(slots[i], i)
    assert len(d) == 5
    assert not d.remove(slots[0], 0)
    assert sorted(d.expire(200.0)) == [1, 3, 5, 7, 9]
    assert len(d) == 0


def test_past_deadlines_fire_at_the_next_sweep_and_long_gaps_are_cheap():
    d = Deadlines(0.01, now=0.0)
    d.expire(5.0)
    d.add("late", "late", 1.0)           # already past
    assert d.expire(5.0) == []           # not early: slot after the last sweep
    assert d.expire(5.02) == ["late"]
    d.add("far", "far", 10_000.0)
    assert d.expire(9_999.0) == []       # walks filled slots, not a million empty ones
    assert d.expire(10_000.0) == ["far"]
