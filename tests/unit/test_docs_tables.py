"""The message tables in docs/protocol.md and docs/cluster.md say what the code does."""

import re
from pathlib import Path

from rpcbus.cluster.messages import FIELDS, INV_CALLER, INV_TRACEPARENT, INV_USER, INVOKE
from rpcbus.protocol import KIND_NAMES, REQ_CALLER, REQ_SENT_MS, REQ_USER, REQUEST, SHAPES

DOCS = Path(__file__).parents[2] / "docs"
ROW = re.compile(r"^\| (\d+) \| ([A-Z_]+) \|(.*)\|\s*$")


def rows(page: str) -> list[tuple[int, str, str]]:
    return [(int(m[1]), m[2], m[3]) for line in (DOCS / page).read_text().splitlines()
            if (m := ROW.match(line))]


def split_top(text: str) -> tuple[str, ...]:
    """``a, {b, c}, [d, ...]`` -> ("a", "{b, c}", "[d, ...]"): commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "{[" and 1 or ch in "}]" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return tuple(parts)


def test_the_client_protocol_table_gives_every_message_its_fields():
    found = {}
    for line in (DOCS / "protocol.md").read_text().splitlines():
        m = re.match(r"^\| (\d+) \| ([A-Z_]+) \| ([^|]+) \| `\[(\d+), (.*?)\]`", line)
        if m:
            kind, name, direction = int(m[1]), m[2], m[3].strip()
            assert KIND_NAMES.get(kind) == name and int(m[4]) == kind, (kind, name)
            found[(kind, direction)] = split_top(m[5])
    assert found == SHAPES
    assert {kind for kind, _ in SHAPES} == set(KIND_NAMES)
    to_provider = SHAPES[(REQUEST, "node → provider")]
    assert to_provider.index("caller") + 1 == REQ_CALLER
    assert to_provider.index("sent_ms") + 1 == REQ_SENT_MS
    assert to_provider.index("user?") + 1 == REQ_USER


def test_the_cluster_table_names_every_kind_with_its_number_and_fields():
    found = rows("cluster.md")
    for kind, name, rest in found:
        assert kind in FIELDS, f"{name} ({kind}) is not a cluster kind"
        fields = [f.strip() for quoted in re.findall(r"`([^`]*)`", rest)
                  for f in quoted.split(",")]
        assert (name, tuple(fields)) == FIELDS[kind], (kind, name, fields)
    assert {kind for kind, _, _ in found} == set(FIELDS)
    assert not set(FIELDS) & set(KIND_NAMES)  # the two protocols' kinds never collide
    invoke = FIELDS[INVOKE][1]
    assert (invoke.index("caller"), invoke.index("traceparent?"), invoke.index("user?")) == (
        INV_CALLER - 1, INV_TRACEPARENT - 1, INV_USER - 1)
