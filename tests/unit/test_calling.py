"""The SDK's caller and provider rules, as pure cores (rpcbus.calling, rpcbus.provider)."""

from rpcbus import errors
from rpcbus.calling import Calls
from rpcbus.protocol import (
    ACCEPT,
    ACCEPT_UPTO,
    CANCEL,
    PING,
    PROVIDE,
    REJECT,
    REJECT_BUSY,
    REJECT_LATE,
    REQUEST,
)
from rpcbus.provider import Freshness, Held, Serving


def test_a_call_refused_unrun_then_lost_is_not_sent_a_third_time():
    """SHUTTING_DOWN means it never ran, so it goes on the next connection; once sent
    there it may run, and losing that connection fails it unless it is idempotent."""
    calls = Calls[str](0.0, grace=1.0)
    assert calls.make(1, "f", "x", 2000, None, 2.0, idempotent=False, wire="a") == \
        [REQUEST, 1, "f", "x", 2000]
    assert calls.make(2, "f", "y", None, None, 2.0, idempotent=True, wire="a")
    assert calls.refused_unrun(1, "a") and calls.waiting(1)
    assert not calls.refused_unrun(1, "a")  # not on "a" any more: ignored
    assert calls.send_queued("b", 0.5) == [[REQUEST, 1, "f", "x", 1500]]  # time left
    assert calls.lost("a", resend=True) == []          # 2: idempotent, waits
    assert [c.cid for c in calls.lost("b", resend=True)] == [1]  # may have run: fails
    assert calls.send_queued("c", 1.0) == [[REQUEST, 2, "f", "y", 1000]]
    assert [c.cid for c in calls.lost("c", resend=False)] == [2]  # no reconnecting
    assert len(calls) == 0 and calls.send_queued("d", 1.0) == []


def test_a_did_not_run_code_after_a_resend_says_the_call_may_have_run():
    calls = Calls[str](0.0, grace=1.0)
    calls.make(1, "f", None, 1000, None, 1.0, idempotent=True, wire="a")
    calls.make(2, "f", None, 1000, None, 1.0, idempotent=True, wire="a")
    assert calls.error(1, errors.NO_PROVIDER, "none").code == errors.NO_PROVIDER
    calls.lost("a", resend=True)
    calls.send_queued("b", 0.1)
    lost = calls.error(1, errors.NO_PROVIDER, "none")
    assert isinstance(lost, errors.ConnectionLostError) and "NO_PROVIDER" in lost.message
    assert calls.error(2, errors.PROVIDER_ERROR, "boom").code == errors.PROVIDER_ERROR


def test_every_call_ends_by_its_deadline_and_grace_with_what_happened_to_it():
    calls = Calls[str](0.0, grace=1.0, sweep=0.05)
    calls.make(1, "f", None, 500, None, 0.5, idempotent=False, wire=None)  # never sent
    calls.make(2, "f", None, 500, None, 0.5, idempotent=False, wire="a")
    calls.make(3, "f", None, 500, None, 0.5, idempotent=False, wire="a")
    calls.forget(3)                                   # answered
    calls.control(4, PROVIDE, "a", 1.5)                # a PROVIDE: no grace added
    assert calls.expire(1.4) == []
    assert calls.send_queued("b", 0.6) == []          # its time is up: not sent late
    ended = {call.cid: type(exc) for call, exc in calls.expire(1.6)}
    assert ended == {1: errors.ConnectionLostError, 2: errors.ResponseTimeoutError,
                     4: errors.ResponseTimeoutError}
    assert calls.expire(10.0) == [] and len(calls) == 0


def test_cancels_go_only_where_a_call_was_sent_and_is_unanswered():
    calls = Calls[str](0.0, grace=1.0)
    calls.make(1, "f", None, None, {"traceparent": "t"}, 5.0, False, "a")
    calls.make(2, "f", None, None, None, 5.0, False, None)
    calls.control(3, PING, "a", 5.0)
    assert calls.cancels() == [("a", [CANCEL, 1])]     # not the control, not the unsent
    assert calls.give_up(2, answered=False) is None
    assert calls.give_up(1, answered=True) is None
    assert calls.cancels() == [] and [c.cid for c in calls.on("a")] == [3]


def test_a_request_read_after_the_process_was_held_never_sets_the_clock_offset():
    """The connection's first REQUEST was read 1 s late (its loop held by a handler):
    with no offset known it is refused; it does not become the offset either, so the
    next late one is still judged stale once a prompt one has set it."""
    fresh = Freshness(stale_after_ms=500)
    assert fresh.stale(1000, 2.0, late_by=1.0)        # sent at 1 s, read at 2 s: unknown
    assert not fresh.stale(2000, 2.0)                  # read at once: the offset is 0
    assert fresh.stale(2100, 2.9, late_by=0.8)         # 800 ms old
    assert not fresh.stale(2800, 2.9, late_by=0.8)     # held, but sent late in the hold


def test_held_sees_a_stall_whether_the_frame_or_the_late_tick_runs_first():
    held = Held(0.05, 0.0)
    held.tick(0.05)
    assert held.late_by(0.07) == 0.0
    assert abs(held.late_by(1.10) - 1.0) < 1e-9       # asyncio: I/O before the late tick
    held.tick(1.10)                                    # uvloop: the late tick first
    assert abs(held.late_by(1.10) - 1.0) < 1e-9
    held.tick(1.15)
    assert held.late_by(1.16) == 0.0


def test_a_call_ended_while_it_waits_for_a_connection_is_never_sent():
    """Its record leaves every table at once: given up or answered, nothing of it is
    sent when a connection comes; the record carries what the shell gave it."""
    calls = Calls[str](0.0, grace=1.0)
    calls.make(1, "f", None, 1000, None, 1.0, False, None, waiter="w1")
    calls.make(2, "f", None, 1000, None, 1.0, False, None, REQUEST, "w2", ["part"])
    calls.make(3, "f", None, 1000, None, 1.0, False, None)
    assert calls.give_up(1, answered=False) is None    # never sent: no CANCEL
    ended = calls.forget(2)
    assert ended is not None and (ended.waiter, ended.parts) == ("w2", ["part"])
    assert calls.forget(2) is None                     # once
    assert calls.send_queued("a", 0.5) == [[REQUEST, 3, "f", None, 500]]
    assert calls.expire(5.0) != [] and len(calls) == 0


def _request(attempt, name="f", sent_ms=None, left_ms=1000, ack_ms=None):
    """A REQUEST as a node sends it to a provider (clients/protocol.py REQ_*)."""
    msg = [REQUEST, attempt, name, None, left_ms, "caller", sent_ms, None, None, None]
    return msg if ack_ms is None else [*msg, ack_ms]


def test_a_frame_of_requests_is_accepted_in_one_message_before_any_handler_starts():
    """The provider core queues what it refuses at once, then at the frame's end one
    ACCEPT_UPTO for the REQUESTs it took, and only then hands their handlers over; a
    CANCEL in the same frame keeps one from ever starting."""
    sent = []
    serving = Serving(sent.append, {"f": "entry-f"}.get, accept_upto=True)
    assert serving.request(_request(1), 0.0, open=True)
    assert serving.request(_request(2, name="gone"), 0.0, open=True)   # not provided
    assert serving.request(_request(3), 0.0, open=True)
    assert serving.request(_request(4), 0.0, open=True)
    assert sent == [[REJECT, 2]] and serving.running == {}  # nothing started yet
    assert serving.cancel(4) is None                         # in the frame: never starts
    starting = serving.take_starting()
    assert [(attempt, entry) for attempt, _, entry, _ in starting] == \
        [(1, "entry-f"), (3, "entry-f")]
    assert sent[-1] == [ACCEPT_UPTO, 3]                      # before the handlers run
    serving.started(1, "task-1")
    serving.started(3, "task-3")
    assert serving.cancel(3) == "task-3"                     # the node gave it up
    assert not serving.finished(3)                           # its answer is dropped
    assert serving.finished(1) and not serving.finished(1)   # sent once
    assert serving.take_starting() == [] and sent[-1] == [ACCEPT_UPTO, 3]  # no empty one


def test_a_provider_refuses_unrun_what_it_read_late_could_not_start_or_cannot_answer():
    """REJECT LATE for a REQUEST older than half its ack window (the node moves it on),
    REJECT BUSY when the workers cannot take it soon, a plain REJECT on a connection
    that closes; each before any ACCEPT, none of them started. A node that takes no
    ACCEPT_UPTO gets one ACCEPT per call."""
    sent = []
    serving = Serving(sent.append, {"f": "entry-f"}.get, accept_upto=False,
                      stale_after_ms=500)
    assert serving.request(_request(1, sent_ms=1000), 1.0, open=True)  # learns the offset
    assert not serving.request(_request(2, sent_ms=1000), 1.6, open=True)  # 600 ms old
    assert serving.request(_request(3, sent_ms=1000, ack_ms=2000), 1.6, open=True)  # its own
    assert serving.request(_request(4, sent_ms=1600), 1.6, open=True,
                           full=lambda entry, left_ms: left_ms < 5000)
    assert serving.request(_request(5, sent_ms=1600), 1.6, open=False)
    assert sent == [[ACCEPT, 1], [REJECT, 2, REJECT_LATE], [ACCEPT, 3],
                    [REJECT, 4, REJECT_BUSY], [REJECT, 5]]
    assert (serving.stale_requests, serving.busy_requests) == (1, 1)
    assert [start[0] for start in serving.take_starting()] == [1, 3]
    assert sent[-1] == [REJECT, 5]                           # no ACCEPT_UPTO for this node
    serving.started(1, "task-1")
    flow = serving.stream(3, window=2)
    serving.started(3, "task-3")
    flow.waiter = "wake-3"
    assert serving.credit(3, 1) == "wake-3" and serving.credit(3, 1) is None
    assert sorted(serving.lost()) == ["task-1", "task-3"]    # the connection is gone
    assert serving.running == {} and serving.flows == {} and not serving.finished(1)
