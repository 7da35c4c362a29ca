"""The client wire codec and message checks, without sockets."""

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus import protocol as p
from rpcbus.transport import pack_in_frames

scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) \
    | st.text(max_size=20) | st.binary(max_size=20)
data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
messages = st.tuples(st.integers(0, 127), st.lists(data, max_size=5)).map(lambda t: [t[0], *t[1]])


@given(st.lists(messages, min_size=1, max_size=20))
def test_frames_round_trip_one_or_many_messages(msgs):
    assert p.decode(p.encode(msgs)) == msgs


@given(st.lists(st.lists(messages, min_size=1, max_size=3).map(p.encode), min_size=1, max_size=30),
       st.integers(8, 200), st.integers(2, 6), st.booleans())
def test_prepacked_messages_group_into_bounded_frames(frames, max_frame, most, stamped):
    parts = [msgpack.packb(m) for f in frames for m in p.decode(f)]
    expected = [m for f in frames for m in p.decode(f)]
    sent = [p.SENT, 1234]
    out = pack_in_frames(parts, max_frame, most, msgpack.packb(sent) if stamped else b"")
    decoded = [p.decode(frame) for frame in out]
    if stamped:   # every frame's calls are timed from its own SENT, not only the first's
        assert all(msgs[0] == sent for msgs in decoded)
        decoded = [msgs[1:] for msgs in decoded]
    assert [m for msgs in decoded for m in msgs] == expected
    for frame, msgs in zip(out, decoded, strict=True):
        assert len(msgs) + stamped <= most
        # only a frame of one oversized message may exceed the bound
        assert len(frame) <= max_frame or len(msgs) == 1


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_fail_with_protocol_error_only(raw):
    try:
        msgs = p.decode(raw)
    except p.ProtocolError:
        return
    assert all(type(m) is list and m and type(m[0]) is int for m in msgs)


@settings(max_examples=500)
@given(messages)
def test_check_from_client_never_raises(msg):
    problem = p.check_from_client(msg)
    assert problem is None or isinstance(problem, str)


@pytest.mark.parametrize("frame, why", [
    (msgpack.packb({"a": 1}), "non-empty array"),
    (msgpack.packb([]), "non-empty array"),
    (msgpack.packb([[16, 1], "x"]), "every message"),
    (b"\xc1", "not valid msgpack"),
])
def test_bad_frames_say_what_is_wrong(frame, why):
    with pytest.raises(p.ProtocolError, match=why):
        p.decode(frame)


@pytest.mark.parametrize("msg, why", [
    ([p.REQUEST, 1, "a.b", None], "REQUEST takes"),
    ([p.REQUEST, -1, "a.b", None, None], "cid must be"),
    ([p.REQUEST, 1, 5, None, None], "name must be a string"),
    ([p.REQUEST, 1, "x" * 129, None, None], "name must be a string of 1-128"),
    ([p.REQUEST, 1, "a", None, 0], "timeout_ms"),
    ([p.REQUEST, 1, "a", None, 1.5], "timeout_ms"),
    ([p.RESPONSE, "1", None], "RESPONSE takes"),
    ([p.ACCEPT, 1, 2], "ACCEPT takes"),
    ([p.ERROR, 1, "X"], "ERROR takes"),
    ([p.PROVIDE, 1, []], "non-empty array"),
    ([p.PROVIDE, 1, ["bad name"]], "invalid rpc name"),
    ([p.PROVIDE, 1, ["ok", 3]], "invalid rpc name"),
    ([p.AUTH, "me"], "AUTH takes"),
    ([p.CANCEL, "x"], "CANCEL takes"),
    ([p.AUTH_OK, {}], "not sent by clients"),
    ([99], "unknown message kind 99"),
])
def test_malformed_messages_are_named(msg, why):
    assert why in p.check_from_client(msg)


@pytest.mark.parametrize("msg", [
    [p.REQUEST, 2**64 - 1, "math.add", {"a": 1}, None],
    [p.REQUEST, 0, "a", [1, 2], 5000],
    [p.RESPONSE, 7, None], [p.ACCEPT, 7], [p.REJECT, 7], [p.ERROR, 7, "X", "boom"],
    [p.PROVIDE, 1, ["billing.charge", "a:b/c-d_e"]], [p.UNPROVIDE, 1, ["x"]],
    [p.PING], [p.PING, b"x"], [p.AUTH, {}],
])
def test_well_formed_messages_pass(msg):
    assert p.check_from_client(msg) is None


def test_names():
    assert p.valid_name("billing.v2/charge:eu-west_1")
    assert not p.valid_name("")
    assert not p.valid_name(".hidden")
    assert not p.valid_name("with space")
    assert p.valid_name("with%20space") and p.valid_name("%2Fleading")   # deepstream's
    assert not any(p.valid_name(n) for n in ("50%", "a%2", "a%2f", "%zz"))  # only %XX
    assert not p.valid_name("x" * 129)
    assert p.valid_name("x" * 129, max_len=200)
