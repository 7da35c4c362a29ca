"""The outbox (cluster/outbox.py): answers of calls that ran outlive a failing bus
session, and never go out again on the session that failed them."""

from rpcbus.cluster.outbox import Outbox


def test_a_failed_rounds_answers_wait_for_the_next_session_not_the_failing_one():
    now = [0.0]
    wakes = []
    box = Outbox(lambda: now[0], on_queued=lambda: wakes.append(1))
    box.up = True
    box.came_up()
    box.publish("n2", ["answer", 1], to=7, hold_until=5.0)
    box.publish("ctrl", ["beat"])
    first = box.take_round()
    # the session's connection is closed: the writer learns it as the round fails, at
    # once, before the bus has ended the session. Queued again on it, the answer would
    # fail again at once, round after round, until its deadline: the node's loop spun.
    box.failed(first)
    assert not box.queued and not box.up
    box.publish("n2", ["late", 2], to=7)         # nothing else is kept while down
    assert box.stats["dropped"] == 1
    box.went_down()                              # the bus ends the session: no change
    box.up = True
    box.came_up()                                # the next session sends it
    second = box.take_round()
    assert second.out == {"n2": [["answer", 1]]} and second.to == {"n2": 7}
    # a round of an earlier session failing late: queued again on the current one
    box.failed(first)
    assert box.up and box.take_round().out == {"n2": [["answer", 1]]}
    now[0] = 6.0                                 # past its hold: dropped, counted
    box.failed(second)
    box.up = True
    box.came_up()
    assert not box.queued and box.stats["dropped"] == 2
