"""rpcbus history-gen injects what it is asked to, or says why it cannot."""

import json
from collections import Counter

import pytest

from rpcbus.analytics.historygen import generate


def test_a_provider_named_for_a_fault_serves_and_shows_it(tmp_path):
    # one rpc, six providers: three or four of them would serve nothing
    generate(str(tmp_path), nodes=2, providers=6, rpcs=1, hours=0.1, window=30, seed=4,
             failing=("p1", "p2", "p3", "p4", "p5", "p6"))
    calls, errors = Counter(), Counter()
    for path in tmp_path.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "calls" in row:
                calls[row["provider"]] += row["calls"]
                errors[row["provider"]] += row["errors"]
    assert set(calls) == {f"p{i}" for i in range(1, 7)}
    assert all(0.1 < errors[p] / calls[p] < 0.3 for p in calls)   # ~20 % each


def test_a_fault_on_no_such_provider_is_refused(tmp_path):
    with pytest.raises(ValueError, match="p7: no such provider"):
        generate(str(tmp_path), providers=6, hours=0.01, slow=("p7@1-2",))
