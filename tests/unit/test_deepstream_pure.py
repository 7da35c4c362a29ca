"""deepstream's protocol (broker/ds_wire.py, broker/ds_rules.py), pure: frames byte for
byte as @deepstream/client 7.0.5 and @deepstream/protobuf's builder write them, and one
client's conversation translated both ways."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpcbus import errors
from rpcbus.broker import ds_wire as w
from rpcbus.broker.ds_rules import REQUEST_ERROR, DeepstreamRules, ds_name, rpc_name
from rpcbus.broker.ds_wire import DsMessage, DsProtocolError
from rpcbus.protocol import (
    ACCEPT,
    AUTH,
    AUTH_FAIL,
    AUTH_OK,
    CANCEL,
    DRAIN_PING,
    EMIT,
    ERROR,
    EVENT,
    GAP,
    OK,
    PART,
    PING,
    PONG,
    PROVIDE,
    REJECT,
    REQUEST,
    RESPONSE,
    STREAM,
    SUBSCRIBE,
    UNSUBSCRIBE,
    valid_name,
)

# What the client writes (captured from @deepstream/client 7.0.5 and its protobuf builder)
FROM_CLIENT = {
    "3f10021a3b08052a1e77733a2f2f3132372e302e302e313a363032302f6465657073747265616d3204302e"
    "31613a05372e302e35420a6a617661736372697074": DsMessage(
        w.T_CONNECTION, w.C_CHALLENGE, url="ws://127.0.0.1:6020/deepstream",
        protocol_version="0.1a", sdk_version="7.0.5", sdk_type="javascript"),
    "0610021a020802": DsMessage(w.T_CONNECTION, w.C_PING),
    "3110031a2d080212297b22757365726e616d65223a22776f726b6572222c2270617373776f7264223a2277"
    "30726b6572227d": DsMessage(w.T_AUTH, w.A_REQUEST,
                                data='{"username":"worker","password":"w0rker"}'),
    "2410061a2008081a0133320c62696c6c696e672e6563686f320b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_PROVIDE, correlation_id="3", names=("billing.echo", "billing.add")),
    "3710061a330802121b7b2261223a312c2262223a5b322e352c6e756c6c2c22c3a9225d7d1a056b71317832"
    "3a0b62696c6c696e672e616464": DsMessage(w.T_RPC, w.R_REQUEST,
                                            data='{"a":1,"b":[2.5,null,"é"]}',
                                            correlation_id="kq1x2", name="billing.add"),
    "1710061a1308041a0231373a0b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_ACCEPT, correlation_id="17", name="billing.add"),
    "1a10061a1608051201331a0231373a0b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_RESPONSE, data="3", correlation_id="17", name="billing.add"),
    "2710061a230807120e226f7574206f662073746f636b221a0231373a0b62696c6c696e672e616464":
        DsMessage(w.T_RPC, w.R_REQUEST_ERROR, data='"out of stock"', correlation_id="17",
                  name="billing.add"),
    "1710061a1308061a0231373a0b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_REJECT, correlation_id="17", name="billing.add"),
    "1310051a0f0803320b736f6d652f7265636f7264": DsMessage(w.T_RECORD, 3, name="some/record"),
}

# What deepstream 7's server writes for the same (its builder, getMessage)
TO_CLIENT = {
    "0610021a020804": DsMessage(w.T_CONNECTION, w.C_ACCEPT),
    "0610021a020803": DsMessage(w.T_CONNECTION, w.C_PONG),
    "0610031a020803": DsMessage(w.T_AUTH, w.A_AUTH_SUCCESSFUL),
    "1f10031a1b080412172261757468656e7469636174696f6e206661696c656422": DsMessage(
        w.T_AUTH, w.A_AUTH_UNSUCCESSFUL, data='"authentication failed"'),
    "0610031a020864": DsMessage(w.T_AUTH, w.A_TOO_MANY_AUTH_ATTEMPTS),
    "0b10061a0708081a01332801": DsMessage(w.T_RPC, w.R_PROVIDE, correlation_id="3",
                                          is_ack=True),
    "2a10061a26080212077b2261223a317d1a0231373a0b62696c6c696e672e616464520866726f6e74656e64":
        DsMessage(w.T_RPC, w.R_REQUEST, data='{"a":1}', correlation_id="17",
                  name="billing.add", requestor_name="frontend"),
    "1d10061a1908051201331a056b713178323a0b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_RESPONSE, data="3", correlation_id="kq1x2", name="billing.add"),
    "1a10061a1608641a056b713178323a0b62696c6c696e672e616464": DsMessage(
        w.T_RPC, w.R_NO_RPC_PROVIDER, correlation_id="kq1x2", name="billing.add"),
    "1e10061a1a086b1a056b7131783220013a0b61646d696e2e72657365744802": DsMessage(
        w.T_RPC, w.R_MESSAGE_DENIED, correlation_id="kq1x2", name="admin.reset",
        original_action=w.R_REQUEST, is_error=True),
    "1b10061a1708671a02313720013a0b62696c6c696e672e6164644805": DsMessage(
        w.T_RPC, w.R_INVALID_RPC_CORRELATION_ID, correlation_id="17", name="billing.add",
        original_action=w.R_RESPONSE, is_error=True),
    "1710051a1308732001320b736f6d652f7265636f72645003": DsMessage(
        w.T_RECORD, w.MESSAGE_DENIED[w.T_RECORD], name="some/record", original_action=3,
        is_error=True),
}


@pytest.mark.parametrize("hexed", list(FROM_CLIENT) + list(TO_CLIENT))
def test_frames_read_and_written_byte_for_byte(hexed):
    msg = {**FROM_CLIENT, **TO_CLIENT}[hexed]
    assert w.decode(bytes.fromhex(hexed), 10) == [msg]
    assert w.encode(msg).hex() == hexed


_text = st.text(max_size=200)
_action = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(max_examples=500)
@given(action=_action, data=st.none() | _text, cid=st.none() | _text,
       name=st.none() | _text, names=st.lists(_text, max_size=3).map(tuple),
       is_ack=st.booleans(), is_error=st.booleans(), original=st.none() | _action,
       requestor=st.none() | _text)
def test_an_rpc_message_is_written_as_the_generic_writer_writes_it_and_read_back(
        action, data, cid, name, names, is_ack, is_error, original, requestor):
    """Every call's messages go through ``_rpc_body``, the generic writer unrolled for
    RpcMessage: the same bytes for any RpcMessage, which read back as the message."""
    msg = DsMessage(w.T_RPC, action, data, cid, name, names, is_ack, is_error, original,
                    requestor)
    assert w._rpc_body(msg) == w._body(msg)
    assert w.decode(w.encode(msg), 1) == [msg]


@settings(max_examples=1000)
@given(raw=st.binary(max_size=300) | st.lists(st.integers(0, 0x1F), max_size=60).map(bytes))
def test_any_bytes_read_as_messages_or_one_protocol_error(raw):
    """Whatever a frame holds, reading it gives messages or a DsProtocolError, nothing
    else (the node answers the one, strikes the other)."""
    try:
        msgs = w.decode(raw, 10)
    except DsProtocolError:
        return
    assert 1 <= len(msgs) <= 10 and all(type(m) is DsMessage for m in msgs)


def test_a_frame_of_several_and_broken_frames():
    two = bytes.fromhex("0610021a020802") * 2
    assert w.decode(two, 10) == [DsMessage(w.T_CONNECTION, w.C_PING)] * 2
    with pytest.raises(DsProtocolError, match="over 1 messages"):
        w.decode(two, 1)
    good = bytes.fromhex("1a10061a1608051201331a0231373a0b62696c6c696e672e616464")
    for broken, why in [(b"", "empty"), (good[:-1], "past its frame"),
                        (b"\xff" * 12, "ten bytes"),
                        (bytes.fromhex("0710061a0312") + b"\x05a", "past its message"),
                        (bytes.fromhex("0710061a033a01") + b"\xff", "UTF-8"),
                        (bytes.fromhex("0410061a00") + b"\x0f", "past its frame")]:
        with pytest.raises(DsProtocolError, match=why):
            w.decode(broken, 10)
    # an unknown topic or field is no error: the rules say what they make of it
    assert w.decode(bytes.fromhex("04105a1a00"), 10) == [DsMessage(90, 0)]
    assert w.decode(bytes.fromhex("0810061a0408027801"), 10) == [DsMessage(w.T_RPC, 2)]


def opened(**kw):
    rules = DeepstreamRules(timeout_ms=kw.get("timeout_ms", 10_000),
                            max_failures=kw.get("max_failures", 3), stats=Counter())
    assert rules.inbound(DsMessage(w.T_CONNECTION, w.C_CHALLENGE)) == (
        [], [DsMessage(w.T_CONNECTION, w.C_ACCEPT)], "")
    into, out, problem = rules.inbound(DsMessage(w.T_AUTH, w.A_REQUEST,
                                                 data='{"username":"u","password":"p"}'))
    assert into == [[AUTH, {"user": "u", "password": "p"}]] and not out and not problem
    assert rules.outbound([AUTH_OK, {}]) == [DsMessage(w.T_AUTH, w.A_AUTH_SUCCESSFUL)]
    return rules


def rpc(action, **kw):
    return DsMessage(w.T_RPC, action, **kw)


def test_calls_it_makes_get_exactly_one_answer_in_its_words():
    rules = opened(timeout_ms=2500)
    outcomes = {
        errors.NO_PROVIDER: rpc(w.R_NO_RPC_PROVIDER, correlation_id="c", name="n"),
        errors.RESPONSE_TIMEOUT: rpc(w.R_RESPONSE_TIMEOUT, correlation_id="c", name="n"),
        errors.ACCEPT_TIMEOUT: rpc(w.R_ACCEPT_TIMEOUT, correlation_id="c", name="n"),
        errors.PROVIDER_GONE: rpc(w.R_RESPONSE_TIMEOUT, correlation_id="c", name="n"),
        errors.PERMISSION_DENIED: rpc(w.R_MESSAGE_DENIED, correlation_id="c", name="n",
                                      original_action=w.R_REQUEST, is_error=True),
        errors.RATE_LIMITED: rpc(w.R_REQUEST_ERROR, correlation_id="c", name="n",
                                 data='{"code":"RATE_LIMITED","message":"slow down"}'),
    }
    for code, answer in outcomes.items():
        into, _, _ = rules.inbound(rpc(w.R_REQUEST, correlation_id="c", name="n",
                                       data="[1]"))
        assert into == [[REQUEST, into[0][1], "n", [1], 2500]]
        assert rules.outbound([ERROR, into[0][1], code, "slow down"]) == [answer]
        assert rules.outbound([ERROR, into[0][1], code, "again"]) == []  # answered once
    into, _, _ = rules.inbound(rpc(w.R_REQUEST, correlation_id="c", name="n"))
    assert into[0][3] is None                                   # no data: null
    assert rules.outbound([ERROR, into[0][1], errors.APP_ERROR, "none left",
                           ["OUT_OF_STOCK", {"left": 0}]]) == [
        rpc(w.R_REQUEST_ERROR, correlation_id="c", name="n",
            data='{"code":"OUT_OF_STOCK","message":"none left","data":{"left":0}}')]
    into, _, _ = rules.inbound(rpc(w.R_REQUEST, correlation_id="d", name="n", data="1"))
    _, _, problem = rules.inbound(rpc(w.R_REQUEST, correlation_id="d", name="n", data="1"))
    assert "still in flight" in problem                         # its id is taken
    assert rules.outbound([RESPONSE, into[0][1], b"bytes"])[0].data == (
        '{"code":"PROVIDER_ERROR","message":"the answer cannot be written as JSON: '
        'Object of type bytes is not JSON serializable"}')
    assert rules.idle()


def test_calls_it_provides_by_the_attempt_id_and_late_answers_refused():
    rules = opened()
    [req] = rules.outbound([REQUEST, 41, "n", {"a": [1]}, 900, "front@s2", 0, None,
                            "frontend"])
    assert req == rpc(w.R_REQUEST, correlation_id="41", name="n", data='{"a":[1]}',
                      requestor_name="frontend")
    assert rules.inbound(rpc(w.R_ACCEPT, correlation_id="41", name="n"))[0] == [[ACCEPT, 41]]
    assert rules.inbound(rpc(w.R_RESPONSE, correlation_id="41", data='"ok"'))[0] == [
        [RESPONSE, 41, "ok"]]
    rules.outbound([REQUEST, 42, "n", 1, 900, "s3"])
    rules.outbound([CANCEL, 42])                                # the node gave it up
    into, out, _ = rules.inbound(rpc(w.R_RESPONSE, correlation_id="42", name="n", data="1"))
    assert into == [] and out == [rpc(w.R_INVALID_RPC_CORRELATION_ID, correlation_id="42",
                                      name="n", original_action=w.R_RESPONSE,
                                      is_error=True)]
    assert rules.stats["deepstream_late_answers"] == 1
    rules.outbound([STREAM, 43, "n", 1, 900, "s3", 0, None, None, 8])
    assert rules.inbound(rpc(w.R_RESPONSE, correlation_id="43", data="[2]"))[0] == [
        [PART, 43, [2]], [RESPONSE, 43, None]]                  # one answer: one part
    rules.outbound([REQUEST, 44, "n", 1, 900, "s3"])
    assert rules.inbound(rpc(w.R_REQUEST_ERROR, correlation_id="44", data='{"x":1}'))[0] \
        == [[ERROR, 44, errors.APP_ERROR, '{"x":1}', [REQUEST_ERROR, {"x": 1}]]]
    rules.outbound([REQUEST, 45, "n", 1, 900, "s3"])
    assert rules.inbound(rpc(w.R_REJECT, correlation_id="45"))[0] == [[REJECT, 45]]
    assert rules.outbound([REQUEST, 46, "n", float("nan"), 900, "s3"]) == []
    assert rules.refused == [(46, "the call's data cannot be written as JSON for a "
                                  "deepstream provider: Out of range float values are not "
                                  "JSON compliant")]
    assert rules.idle()


def test_provide_answers_once_per_message_and_names_each_refusal():
    rules = opened()
    into, _, _ = rules.inbound(rpc(w.R_PROVIDE, correlation_id="7", names=("a", "b", "c")))
    assert [m[0] for m in into] == [PROVIDE] * 3 and [m[2] for m in into] == [["a"], ["b"],
                                                                              ["c"]]
    assert rules.outbound([OK, into[0][1]]) == []
    assert rules.outbound([ERROR, into[1][1], errors.PERMISSION_DENIED, "no"]) == [
        rpc(w.R_MESSAGE_DENIED, original_action=w.R_PROVIDE, name="b", correlation_id="7",
            is_error=True)]
    assert rules.outbound([OK, into[2][1]]) == [rpc(w.R_PROVIDE, correlation_id="7",
                                                    is_ack=True)]
    # a name with characters rpcbus's names do not take travels as %XX; one too long so
    # is refused here, without a strike
    long = "é" * 30                                          # 180 characters as %XX
    into, out, problem = rules.inbound(rpc(w.R_PROVIDE, correlation_id="8",
                                           names=("get user", long, "ok.name")))
    assert [m[2] for m in into] == [["get%20user"], ["ok.name"]] and not problem
    assert out == [rpc(w.R_MESSAGE_DENIED, original_action=w.R_PROVIDE, name=long,
                       correlation_id="8", is_error=True)]
    rules.outbound([OK, into[0][1]])
    assert rules.outbound([OK, into[1][1]]) == [rpc(w.R_PROVIDE, correlation_id="8",
                                                    is_ack=True)]
    asked = rules.outbound([REQUEST, 41, "get%20user", 1, 1000, "c@s1", 0])
    assert asked[0].name == "get user"                       # its provider's own name
    into, _, _ = rules.inbound(rpc(w.R_UNPROVIDE, correlation_id="9", names=(" ", "100%")))
    assert [m[2] for m in into] == [["%20"], ["100%25"]]
    for name in ("user/get profile", "/x", "-x", "a%b", "a b%20c", "日本", "ok.name"):
        assert valid_name(rpc_name(name)) and ds_name(rpc_name(name)) == name


def test_login_refusals_busy_pings_notices_and_what_is_not_served():
    rules = DeepstreamRules(timeout_ms=1000, max_failures=2, stats=Counter())
    _, _, problem = rules.inbound(DsMessage(w.T_AUTH, w.A_REQUEST, data="{}"))
    assert problem == "CONNECTION CHALLENGE first"
    assert rules.inbound(DsMessage(w.T_CONNECTION, w.C_PING))[1] == [
        DsMessage(w.T_CONNECTION, w.C_PONG)]                    # answered before login too
    rules.inbound(DsMessage(w.T_CONNECTION, w.C_CHALLENGE))
    _, out, problem = rules.inbound(DsMessage(w.T_AUTH, w.A_REQUEST, data="[1]"))
    assert out[0].action == w.A_INVALID_MESSAGE_DATA and "JSON object" in problem
    into, _, _ = rules.inbound(DsMessage(w.T_AUTH, w.A_REQUEST, data='{"token":"t"}'))
    assert into == [[AUTH, {"token": "t"}]]
    assert rules.outbound([AUTH_FAIL, errors.BUSY, "busy"]) == [] and rules.relogin
    assert rules.outbound([AUTH_FAIL, errors.NOT_AUTHENTICATED, "no"]) == [
        DsMessage(w.T_AUTH, w.A_AUTH_UNSUCCESSFUL, data='"no"')]
    rules.inbound(DsMessage(w.T_AUTH, w.A_REQUEST, data='{"token":"t2"}'))
    assert rules.outbound([AUTH_FAIL, errors.NOT_AUTHENTICATED, "no"]) == [
        DsMessage(w.T_AUTH, w.A_AUTH_UNSUCCESSFUL, data='"no"'),
        DsMessage(w.T_AUTH, w.A_TOO_MANY_AUTH_ATTEMPTS)]
    rules = opened()
    assert rules.inbound(DsMessage(w.T_CONNECTION, w.C_PING))[0] == [[PING]]  # priced
    assert rules.outbound([PONG, None]) == [DsMessage(w.T_CONNECTION, w.C_PONG)]
    _, out, problem = rules.inbound(DsMessage(w.T_EVENT, 5, name="news/*"))   # LISTEN
    assert out == [DsMessage(w.T_EVENT, 104, original_action=5, name="news/*",
                             is_error=True)]
    assert not problem and rules.stats["deepstream_refused_topics"] == 1
    assert rules.outbound([ERROR, None, errors.SHUTTING_DOWN, "bye"]) == []
    assert rules.outbound([PING, DRAIN_PING]) == [] and rules.draining and rules.heard_drain
    assert rules.outbound([ERROR, None, errors.NOT_AUTHENTICATED, "expired"]) == []
    assert rules.close_reason == "token expired"


def test_events_subscribe_per_name_and_emit_both_ways():
    rules = opened()
    into, out, problem = rules.inbound(DsMessage(
        w.T_EVENT, w.E_SUBSCRIBE, correlation_id="4", names=("chat/room 1", "x" * 200)))
    assert into == [[SUBSCRIBE, 1, ["chat/room%201"]]] and not problem
    assert out == [DsMessage(w.T_EVENT, w.E_MESSAGE_DENIED, original_action=w.E_SUBSCRIBE,
                             name="x" * 200, correlation_id="4", is_error=True)]
    assert rules.outbound([OK, 1]) == [DsMessage(w.T_EVENT, w.E_SUBSCRIBE, correlation_id="4",
                                                 is_ack=True)]
    into, _, _ = rules.inbound(DsMessage(w.T_EVENT, w.E_SUBSCRIBE, correlation_id="5",
                                         names=("secret",)))
    assert rules.outbound([ERROR, into[0][1], errors.PERMISSION_DENIED, "no"]) == [
        DsMessage(w.T_EVENT, w.E_MESSAGE_DENIED, original_action=w.E_SUBSCRIBE,
                  name="secret", correlation_id="5", is_error=True),
        DsMessage(w.T_EVENT, w.E_SUBSCRIBE, correlation_id="5", is_ack=True)]
    into, _, _ = rules.inbound(DsMessage(w.T_EVENT, w.E_UNSUBSCRIBE, correlation_id="6",
                                         names=("chat/room 1",)))
    assert into == [[UNSUBSCRIBE, 3, ["chat/room%201"]]]
    assert rules.inbound(DsMessage(w.T_EVENT, w.E_EMIT, name="chat/room 1",
                                   data='{"a":[1,2.5]}'))[0] == [
        [EMIT, "chat/room%201", {"a": [1, 2.5]}]]
    assert rules.inbound(DsMessage(w.T_EVENT, w.E_EMIT, name="e"))[0] == [[EMIT, "e", None]]
    assert rules.inbound(DsMessage(w.T_EVENT, w.E_EMIT, name="e", data="{"))[2]  # a strike
    assert rules.outbound([EVENT, "chat/room%201", [None, "é"]]) == [
        DsMessage(w.T_EVENT, w.E_EMIT, name="chat/room 1", data='[null,"é"]')]
    assert rules.outbound([EVENT, "e", b"bytes"]) == []       # JSON cannot carry it
    assert rules.outbound([GAP, "e", 3]) == []
    assert rules.stats["deepstream_unwritable_events"] == 1
    assert rules.stats["deepstream_gaps"] == 1
