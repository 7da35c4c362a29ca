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


def test_answers_nobody_heard_wait_for_their_node_and_go_when_it_is_heard():
    """Redis says a PUBLISH on n2's topic reached nobody (n2's subscriber was dropped):
    the answers it carried wait for n2, go out again when a batch of n2 comes, and are
    dropped (counted) if their deadline passes first or they were for its old process."""
    now = [0.0]
    box = Outbox(lambda: now[0])
    box.up = True
    box.came_up()
    box.publish("n2", ["answer", 1], to=7, hold_until=5.0)
    box.publish("n2", ["ack", 2], to=7)           # not an answer: not kept
    box.publish("n3", ["answer", 3], to=9, hold_until=5.0)
    box.answered(box.take_round(), unheard={"n2"})
    assert not box.queued and box.stats["unheard"] == 1
    box.heard("n3", 9)                            # nothing waits for n3: no change
    assert not box.queued
    box.heard("n2", 7)                            # n2 listens again
    assert box.take_round().out == {"n2": [["answer", 1]]} and not box.unheard
    box.publish("n2", ["answer", 4], to=7, hold_until=5.0)
    box.publish("n2", ["answer", 5], to=7, hold_until=9.0)
    box.answered(box.take_round(), unheard={"n2"})
    now[0] = 6.0
    box.expire()                                  # 4's deadline passed: dropped
    assert box.stats["dropped"] == 1 and len(box.unheard["n2"]) == 1
    box.heard("n2", 8)                            # a new process of n2: 5 was for the old
    assert not box.queued and box.stats["dropped"] == 2 and not box.unheard
