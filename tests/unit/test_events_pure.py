"""The node's events core (broker/events.py): its tables, the channels it listens on, who
gets an event and what crosses the bus, with plain subscribers and no I/O."""

from rpcbus.broker.events import Events
from rpcbus.cluster.messages import EVENT, event_channel
from rpcbus.events import Subscriptions
from rpcbus.protocol import EVENT as CLIENT_EVENT
from rpcbus.protocol import GAP


class Sub:
    def __init__(self, echoes=True, origins=False):
        self.topics = set()
        self.echoes = echoes
        self.origins = origins
        self.got = []
        self.numbered = []

    def event(self, msg):
        assert msg[0] == CLIENT_EVENT and len(msg) in ((3, 5) if self.origins else (3,))
        self.got.append((msg[1], msg[2]))
        self.numbered.append(msg)

    def send(self, msg):
        self.got.append(msg)


def test_an_emit_reaches_each_subscriber_here_once_and_crosses_the_bus_once():
    published, listened = [], []
    events = Events(7, "ns", lambda ch, msg: published.append((ch, msg)),
                    lambda ch, on: listened.append((ch, on)))
    a, b, ds = Sub(), Sub(), Sub(echoes=False)
    events.subscribe(a, ["t", "t", "u"])
    events.subscribe(b, ["t"])
    events.subscribe(ds, ["t"])
    channels = {event_channel("ns", "t"), event_channel("ns", "u")}
    assert {ch for ch, on in listened if on} == channels and len(listened) == len(channels)
    events.emit(a, "t", 1)       # a hears its own; a deepstream client does not
    events.emit(ds, "t", 2)
    assert a.got == [("t", 1), ("t", 2)] and b.got == [("t", 1), ("t", 2)]
    assert ds.got == [("t", 1)]
    assert published == [(event_channel("ns", "t"), [EVENT, "t", 1, 1]),
                         (event_channel("ns", "t"), [EVENT, "t", 2, 2])]
    events.heard("t", 3)         # from another node: to everyone here, none published
    events.heard("nobody", 4)
    assert ds.got[-1] == ("t", 3) and len(published) == 2
    assert events.stats["unheard"] == 1 and events.stats["delivered"] == 8


def test_a_channel_is_left_with_its_last_topic_and_a_gone_connection_leaves_all():
    listened = []
    events = Events(7, "ns", lambda ch, msg: None, lambda ch, on: listened.append((ch, on)))
    a, b = Sub(), Sub()
    events.subscribe(a, ["t", "u"])
    events.subscribe(b, ["t"])
    events.unsubscribe(a, ["t", "never"])
    assert listened[-1][1] is True        # b still holds t's channel
    events.gone(b)
    assert (event_channel("ns", "t"), False) in listened and "t" not in events.subscribers
    events.gone(a)
    assert events.subscribers == {} and events.channels == [] and not a.topics
    assert sorted(ch for ch, on in listened if on) == sorted(ch for ch, on in listened if not on)


def test_a_node_alone_delivers_here_and_publishes_nothing():
    events = Events(7)
    a = Sub()
    events.subscribe(a, ["t"])
    events.emit(None, "t", "x")
    assert a.got == [("t", "x")] and events.channels == []


def test_a_busy_or_late_node_sheds_events_and_tells_each_subscriber_how_many():
    clock = [0.0]
    published = []
    events = Events(7, "ns", lambda ch, msg: published.append(msg), lambda ch, on: None,
                    max_age=1.0, slice_s=0.05, clock=lambda: clock[0])
    a, b = Sub(), Sub()
    events.subscribe(a, ["t"])
    events.subscribe(b, ["u"])
    events.emit(None, "t", 1)           # starts a slice
    events.heard("u", 2, age=1.5)       # heard too late: shed
    clock[0] = 0.06                     # the slice is used up: shed, still published
    events.emit(None, "t", 3)
    events.heard("t", 4)
    assert a.got == [("t", 1)] and b.got == [] and len(published) == 2
    assert events.tick() == 3
    assert a.got[-1] == [GAP, "t", 2] and b.got == [[GAP, "u", 1]]
    events.emit(None, "t", 5)           # a new slice
    assert a.got[-1] == ("t", 5) and events.stats["shed"] == 3


def test_a_subscriber_that_moves_gets_no_event_twice_and_misses_none_after():
    """It had n3's first two events from n3 itself, then moved to n2, where the bus brings
    all of n3's events late: the SDK's rules drop the two it had, keep the rest in order."""
    n3 = Events(3, "ns", lambda ch, msg: bus.append(msg), lambda ch, on: None)
    n2 = Events(2, "ns", lambda ch, msg: None, lambda ch, on: None)
    bus = []
    client = Subscriptions()
    got = []
    client.add("t", got.append, None)
    on_n3, on_n2 = Sub(origins=True), Sub(origins=True)
    n3.subscribe(on_n3, ["t"])
    n3.emit(None, "t", "a")
    n3.emit(None, "t", "b")
    n3.gone(on_n3)                            # it moves to n2
    n2.subscribe(on_n2, ["t"])
    n3.emit(None, "t", "c")
    n2.emit(None, "u", "other node's own")   # n2's own numbers are its own
    for msg in bus:                           # n3's three, late, off the bus
        n2.heard(msg[1], msg[2], 0.0, 3, msg[3])
    for msg in on_n3.numbered + on_n2.numbered:
        client.deliver(*msg[1:])
    assert got == ["a", "b", "c"] and client.repeats == 2
    plain = Sub()                             # a client that did not ask: three fields
    n2.subscribe(plain, ["t"])
    n2.heard("t", "d", 0.0, 3, 4)
    n2.heard("t", "e", 0.0, 3, None)          # from a node that does not number them
    assert plain.got == [("t", "d"), ("t", "e")]
    assert on_n2.numbered[-2:] == [[CLIENT_EVENT, "t", "d", 3, 4], [CLIENT_EVENT, "t", "e"]]
