"""A deepstream client's connection (``@deepstream/client``, unchanged): the shell of
broker/ds_rules.py, which translates its protocol to rpcbus's.

A ``Session`` becomes a ``DeepstreamSession`` when its upgrade request names
``[deepstream] path`` (``Node.deepstream``): the path is read after the TCP
connection, and its Session, exist. Everything a session does stays: the gate's
counts, byte budgets before login, strikes for bad input (a frame that is not
deepstream's protobuf, a message out of turn: one each, the connection closes 1008
past ``limits.max_invalid_messages``), rate limits, permissions, backpressure, the
router. What differs:

- each frame holds deepstream's length-delimited protobuf (broker/ds_wire.py), and
  each message sent is a frame of its own (the client reads one per frame); all of a
  loop tick's frames leave in one write;
- as a provider it may run a call before it accepts it (its handler runs first, its
  ACCEPT follows), so the router never moves an attempt sent to it
  (``runs_before_accept``: ACCEPT_TIMEOUT, or PROVIDER_GONE when it leaves);
- it cannot move to another node when this one drains (``moves_on_drain``): its calls
  are served until it holds none, both ways, then it is closed (1001) and reconnects
  as the client does; one still busy is closed with the rest at the drain deadline;
- a PING before login counts as a WebSocket ping or pong does (``control_received``:
  ``limits.max_control_frames`` per window, then a close 1008); after login it is
  priced by the rate limit as rpcbus's PING. A frame before login is decoded up to
  ``limits.max_control_frames`` + 2 messages (its pings, CHALLENGE and AUTH); one with
  more is closed 1008 there, unread: its rest could only be pings past the budget or
  messages out of turn, and decoding 9,000 of them took ~30 ms;
- when its token expires it is closed (1008): it cannot renew a token in place, and
  logging in again with an expired one fails where the application sees it.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import structlog

from rpcbus import errors
from rpcbus.broker import ds_wire
from rpcbus.broker.ds_rules import OPEN as OPEN_PHASE
from rpcbus.broker.ds_rules import DeepstreamRules
from rpcbus.broker.ds_wire import DsMessage, DsProtocolError
from rpcbus.broker.session import Session
from rpcbus.protocol import AUTH
from rpcbus.transport import OPEN, CloseCode, FrameData, ws_header

log = structlog.get_logger(module="rpcbus.session")


class DeepstreamSession(Session):
    """One deepstream client (see the module docstring)."""

    rules: DeepstreamRules
    _frames: list[bytes]

    def became_deepstream(self) -> None:
        """Its upgrade request named the deepstream path: from the first frame on, it
        speaks deepstream's protocol, and its session rules know it for such a client."""
        core = self.core
        core.runs_before_accept = True
        core.moves_on_drain = False
        core.echoes = False  # its client hands its own events to its own subscribers
        core.send, core.flush = self.send, self.flush  # this class's, not Session's
        timer = self._auth_timer
        if timer is not None:  # the login timer, armed as a Session's: this class's now
            timer.cancel()
            self._auth_timer = self.loop.call_at(timer.when(), self._auth_timeout)
        config = self.node.config
        self.rules = DeepstreamRules(int(config.deepstream.response_timeout * 1000),
                                     config.auth.max_failures, self.node.stats,
                                     config.limits.max_name_length)
        self._frames = []
        self.node.stats["deepstream_connections"] += 1

    # -- in ----------------------------------------------------------------------------

    def text_received(self) -> None:
        self.core.invalid(None, "text frames (deepstream's JSON transport) are not served: "
                          "use the binary protocol, the client's default", self.loop.time())

    def frame_received(self, data: FrameData) -> None:
        now = self.loop.time()
        node = self.node
        node.router.read_at = perf_counter()  # its calls' start, for their latency
        rules = self.rules
        opened = rules.phase == OPEN_PHASE
        most = (self._max_frame_messages if opened
                else node.config.limits.max_control_frames + 2)
        try:
            msgs = ds_wire.decode(bytes(data), most)
        except ds_wire.TooManyMessages:
            if opened:
                node.stats["deepstream_bad_frames"] += 1
                self.core.invalid(None, f"over {most} messages in one frame", now)
            else:  # priced as the pings it must hold
                self.close_for_flood(most, f"over {most} messages in one frame before login")
            return
        except DsProtocolError as exc:
            node.stats["deepstream_bad_frames"] += 1
            self.core.invalid(None, f"not deepstream's protobuf: {exc}", now)
            return
        node.stats["messages_in"] += len(msgs)
        self.core.bytes_in(len(data), now)
        try:
            for m in msgs:
                if (m.topic == ds_wire.T_CONNECTION and m.action == ds_wire.C_PING
                        and rules.phase != OPEN_PHASE and not self.control_received()):
                    return  # before login a PING is priced as a WebSocket ping: closed
                into, replies, problem = rules.inbound(m)
                for reply in replies:
                    self._write(reply)
                if problem:
                    self.core.invalid(None, problem, now)
                if into:
                    self.core.handle(into, now)
                if not self.is_open():
                    return
        except Exception:  # a bug here must cost one frame, never the node
            node.stats["internal_errors"] += 1
            log.exception("frame_handling_failed", session=self.core.sid)
        self._pause_if_full()

    # -- out ---------------------------------------------------------------------------

    def send(self, msg: list[Any]) -> None:
        """An rpcbus message for this client: written as deepstream's, in this tick."""
        rules = self.rules
        for m in rules.outbound(msg):
            self._write(m)
        if rules.refused:  # a call for it whose data JSON cannot carry: not run
            refused, rules.refused = rules.refused, []
            for attempt, why in refused:
                self.node.stats["deepstream_unwritable"] += 1
                self.node.router.refuse_attempt(self.core, attempt, errors.INVALID_MESSAGE, why)
        if rules.relogin:  # AUTH_FAIL BUSY: the client cannot ask again; the node does
            rules.relogin = False
            self.later(0.0, self._relogin)
        if rules.heard_drain:  # it cannot answer the drain's PING: nothing to wait for
            rules.heard_drain = False
            self.loop.call_soon(self.node.notice_heard, self.core)
        if (rules.draining or rules.close_reason) and not self._frames:
            self.loop.call_soon(self.flush)  # its closing is looked at there

    def _write(self, m: DsMessage) -> None:
        payload = ds_wire.encode(m)
        frames = self._frames
        frames.append(ws_header(len(payload), 0) + payload)
        if len(frames) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        frames = self._frames
        if frames:
            self._frames = []
            if self.state is OPEN:
                self.transport.write(b"".join(frames))
                self.frames_out += len(frames)
                self.messages_out += len(frames)
                if self.transport.get_write_buffer_size() > self.max_write_buffer:
                    self.on_slow_consumer()
            else:
                self.dropped_out += len(frames)
        self._resume_if_room()
        rules = self.rules
        if self.core.closed or self.state is not OPEN:
            return
        if rules.close_reason:
            self.fail_now(CloseCode.POLICY_VIOLATION, rules.close_reason)
        elif rules.draining and rules.idle():
            self.node.stats["deepstream_closed_draining"] += 1
            self.fail_now(CloseCode.GOING_AWAY, "node shutting down")

    # -- the shell's hooks ---------------------------------------------------------------

    def _relogin(self) -> None:
        if not self.core.closed and not self.core.authenticated and not self.core.logging_in:
            self.core.handle([[AUTH, self.rules.login]], self.loop.time())

    def _auth_timeout(self) -> None:
        if not self.core.authenticated and not self.core.closed:  # deepstream's word for it first
            self._write(DsMessage(ds_wire.T_CONNECTION, ds_wire.C_AUTHENTICATION_TIMEOUT))
            self.flush()
        super()._auth_timeout()
