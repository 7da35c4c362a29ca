"""The node's events core (broker/events.py): its tables, the channels it listens on, who
gets an event and what crosses the bus, with plain subscribers and no I/O."""

from rpcbus.broker.events import Events
from rpcbus.cluster.messages import EVENT, event_channel


class Sub:
    def __init__(self, echoes=True):
        self.topics = set()
        self.echoes = echoes
        self.got = []

    def event(self, topic, data):
        self.got.append((topic, data))

    def send(self, msg):
        self.got.append(msg)


def test_an_emit_reaches_each_subscriber_here_once_and_crosses_the_bus_once():
    published, listened = [], []
    events = Events("ns", lambda ch, msg: published.append((ch, msg)),
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
    assert published == [(event_channel("ns", "t"), [EVENT, "t", 1]),
                         (event_channel("ns", "t"), [EVENT, "t", 2])]
    events.heard("t", 3)         # from another node: to everyone here, none published
    events.heard("nobody", 4)
    assert ds.got[-1] == ("t", 3) and len(published) == 2
    assert events.stats["unheard"] == 1 and events.stats["delivered"] == 8


def test_a_channel_is_left_with_its_last_topic_and_a_gone_connection_leaves_all():
    listened = []
    events = Events("ns", lambda ch, msg: None, lambda ch, on: listened.append((ch, on)))
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
    events = Events()
    a = Sub()
    events.subscribe(a, ["t"])
    events.emit(None, "t", "x")
    assert a.got == [("t", "x")] and events.channels == []
