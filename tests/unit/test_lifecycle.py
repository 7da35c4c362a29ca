"""The node's own rules (broker/lifecycle.py) driven directly, as the node's shell and the
simulator drive them: the stall hold, the cut-off rule and the drain's order."""

from rpcbus.broker import lifecycle as lc


def test_a_stall_holds_deadlines_and_a_long_one_sends_clients_elsewhere():
    w = lc.Watch(now=0.0, evacuate_after=3.0)
    assert w.swept(0.01, draining=False) == (True, 0.0, False)        # on time
    run, stalled, evacuate = w.swept(1.01, draining=False)             # stopped 1 s
    assert (run, stalled, evacuate) == (False, 1.0, False)             # read first
    assert not w.swept(1.01 + lc.STALL_HOLD / 2, draining=False)[0]
    assert w.swept(1.01 + lc.STALL_HOLD + 0.01, draining=False)[0]    # deadlines again
    assert w.swept(5.0, draining=False)[2]                             # 3.8 s: the cluster
    assert not w.swept(9.0, draining=True)[2]                          # gave it up; not while
                                                                       # it drains


def test_the_bus_down_for_evacuate_after_sends_clients_on_once_until_it_is_back():
    w = lc.Watch(now=0.0, evacuate_after=3.0)
    assert w.bus(1.0, available=False, draining=False) == (lc.NOTHING, 0.0)
    assert w.bus(3.9, available=False, draining=False) == (lc.NOTHING, 0.0)
    assert w.bus(4.0, available=False, draining=False) == (lc.CUT_OFF, 3.0)
    assert w.cut_off and w.bus(9.0, available=False, draining=False) == (lc.NOTHING, 0.0)
    assert w.bus(9.5, available=True, draining=False) == (lc.REACHABLE_AGAIN, 0.0)
    assert not w.cut_off and w.bus(9.6, available=True, draining=False) == (lc.NOTHING, 0.0)
    w.bus(10.0, available=False, draining=False)                       # down again: a new
    assert w.bus(12.0, available=False, draining=True) == (lc.NOTHING, 0.0)  # count; none
    assert w.bus(20.0, available=False, draining=False) == (lc.NOTHING, 0.0)  # while draining


def steps(drain, script):
    """Run ``drain`` over ``script``: (now, flushed, unheard, in_flight, pending) per
    asking; the steps it said."""
    return [drain.next(*facts) for facts in script]


def test_the_drain_announces_waits_for_the_flush_tells_waits_hands_back_flushes_closes():
    d = lc.Drain(drain_timeout=5.0)
    said = steps(d, [(0.0, True, 0, 3, 3),     # announce
                     (0.1, False, 0, 3, 3),    # the announcement not yet out: wait
                     (0.2, True, 0, 3, 3),     # out: tell the clients
                     (0.3, True, 2, 3, 3),     # two have not answered: wait
                     (2.2, True, 2, 3, 3),     # notice_wait over; calls in flight: wait
                     (5.2, True, 0, 2, 2),     # the drain timeout (from telling) passed
                     (5.3, False, 0, 0, 0),    # the last answers not yet out: wait
                     (5.4, True, 0, 0, 0),     # out: close
                     (5.5, True, 0, 0, 0)])
    assert said == [lc.ANNOUNCE, lc.WAIT, lc.TELL, lc.WAIT, lc.WAIT, lc.HAND_BACK, lc.WAIT,
                    lc.CLOSE, lc.DONE]
    assert d.timed_out and d.unheard == 0


def test_a_quiet_drain_hands_nothing_back_and_a_bus_that_never_flushes_costs_a_second():
    d = lc.Drain(drain_timeout=5.0)
    said = steps(d, [(0.0, False, 0, 0, 0), (0.5, False, 0, 0, 0),
                     (1.0 + 1e-9, False, 0, 0, 0),      # FLUSH_WAIT passed: tell anyway
                     (1.1, False, 1, 0, 0),             # nothing in flight, one unheard
                     (3.2, False, 1, 0, 0),             # notice_wait passed: finish
                     (4.2 + 1e-9, False, 1, 0, 0)])     # FLUSH_WAIT passed: close
    assert said == [lc.ANNOUNCE, lc.WAIT, lc.TELL, lc.WAIT, lc.WAIT, lc.CLOSE]
    assert not d.timed_out and d.unheard == 1


def test_a_second_sigterm_stops_the_waits_but_not_the_order():
    d = lc.Drain(drain_timeout=30.0)
    assert steps(d, [(0.0, True, 0, 9, 9), (0.1, True, 0, 9, 9), (0.2, True, 4, 9, 9)]) == [
        lc.ANNOUNCE, lc.TELL, lc.WAIT]
    d.skip()
    assert steps(d, [(0.3, True, 4, 9, 9), (0.4, True, 0, 9, 9)]) == [lc.HAND_BACK,
                                                                        lc.CLOSE]
    early = lc.Drain(drain_timeout=30.0)
    early.skip()                                  # before it told anyone: it still tells
    assert steps(early, [(0.0, True, 0, 1, 1), (0.1, True, 0, 1, 1), (0.2, True, 1, 1, 1)]) \
        == [lc.ANNOUNCE, lc.TELL, lc.HAND_BACK]
