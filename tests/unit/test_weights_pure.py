"""Provider weights (broker/weights.py) and the router's weighted choice with them."""

import json

import pytest

from rpcbus.broker.weights import Weights, WeightsError, WeightsFile, load
from rpcbus.cluster import messages as m
from rpcbus.protocol import REQUEST

from .test_cluster_pure import Node, View, router
from .test_router import Peer


class Provider(Peer):
    def __init__(self, name):
        super().__init__(name)
        self.provider_name = name
        self.hrows = {}


def weights(rpcs, default=1.0):
    return Weights.parse({"schema_version": 1, "default": default, "rpcs": rpcs})


def shares(peers, n):
    return {p.label: sum(1 for msg in p.take() if msg[0] == REQUEST) / n for p in peers}


def test_local_providers_and_nodes_are_chosen_by_weight_and_retries_skip_the_tried():
    a = Node("A")
    view = View({"x": [(a, 2.0)]})             # node A advertises a weight sum of 2
    r, caller = router(view), Peer("c")
    p1, p2 = Provider("w1"), Provider("w2")
    r.provide(p1, ["x"])
    r.provide(p2, ["x"])
    r.set_weights(weights({"x": {"w1": 1.5, "w2": 0.5}}))
    n = 20_000
    for i in range(n):
        r.request(caller, i, "x", None, None, now=0.0)
    got = shares([a, p1, p2], n)
    # expected 2/4, 1.5/4, 0.5/4; sd of a share <= 0.0036: 6 sd bounds
    assert abs(got["A"] - 0.5) < 0.022 and abs(got["w1"] - 0.375) < 0.022
    assert abs(got["w2"] - 0.125) < 0.015
    # a rejected attempt goes to a target not yet tried, still by weight
    r.request(caller, n, "x", None, None, now=0.0)
    first = next(p for p in (a, p1, p2) if p.sent)
    attempt = first.take()[0][1]
    r.reject(first, attempt, now=0.0)
    assert sum(1 for p in (a, p1, p2) if p is not first and p.sent) == 1


def test_a_node_advertises_its_weight_sum_and_again_when_the_weights_change():
    r, told = router(View()), []
    r.join(r.cluster, lambda name, count: told.append((name, count)))
    p1, p2 = Provider("w1"), Provider("w2")
    r.provide(p1, ["x"])
    r.provide(p2, ["x"])
    assert told == [("x", 1), ("x", 2)] and r.advertised("x") == 2
    r.set_weights(weights({"x": {"w1": 0.25}}, default=2.0))
    assert told[-1] == ("x", 2.25) and r.advertised("x") == 2.25
    r.unprovide(p2, ["x"])
    assert told[-1] == ("x", 0.25)
    r.set_weights(None)
    assert told[-1] == ("x", 1)


def test_float_counts_cross_the_bus_and_bad_ones_are_left_out():
    good = [m.PROVIDER_UPDATE, "x", 2.25]
    bad = [[m.PROVIDER_UPDATE, "x", -1], [m.PROVIDER_UPDATE, "x", float("nan")],
           [m.PROVIDER_UPDATE, "x", float("inf")], [m.PROVIDER_UPDATE, "x", "2"]]
    batch = m.decode_batch(m.encode_batch("n1", 1, 0, 0.0, [good, *bad]))
    assert batch.messages == [good] and batch.malformed == len(bad)


@pytest.mark.parametrize("doc, needle", [
    ([], "JSON object"),
    ({"schema_version": 2}, "schema_version"),
    ({"schema_version": 1, "default": 0}, "default"),
    ({"schema_version": 1, "rpcs": {"x": {"w1": -1}}}, "rpcs.x.w1"),
    ({"schema_version": 1, "rpcs": {"x": {"w1": float("nan")}}}, "rpcs.x.w1"),
    ({"schema_version": 1, "rpcs": {"x": {"w1": True}}}, "rpcs.x.w1"),
    ({"schema_version": 1, "rpcs": {"x": [1]}}, "rpcs.x"),
])
def test_bad_weights_are_refused_naming_what_is_wrong(doc, needle):
    with pytest.raises(WeightsError, match=needle.replace(".", r"\.")):
        Weights.parse(doc)


def test_a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_weights(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"schema_version": 1, "rpcs": {"x": {"w1": 3}}}))
    f = WeightsFile(str(path))
    assert f.weights.of("x", "w1") == 3 and f.weights.of("x", "other") == 1
    assert f.reload() is None                                  # unchanged
    path.write_text(json.dumps({"schema_version": 1, "rpcs": {"x": {"w1": 0.5}}}) + " ")
    assert f.reload().of("x", "w1") == 0.5 and f.reloads == 1
    path.write_text("{not json")
    with pytest.raises(WeightsError, match="weights.json"):
        f.reload()
    assert f.weights.of("x", "w1") == 0.5 and f.reload_errors == 1
    with pytest.raises(WeightsError):
        load(str(tmp_path / "missing.json"))

