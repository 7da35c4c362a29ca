"""The message tables in docs/protocol.md and docs/cluster.md say what the code does."""

import re
from pathlib import Path

from rpcbus.cluster.messages import FIELDS
from rpcbus.protocol import KIND_NAMES

DOCS = Path(__file__).parents[2] / "docs"
ROW = re.compile(r"^\| (\d+) \| ([A-Z_]+) \|(.*)\|\s*$")


def rows(page: str) -> list[tuple[int, str, str]]:
    return [(int(m[1]), m[2], m[3]) for line in (DOCS / page).read_text().splitlines()
            if (m := ROW.match(line))]


def test_the_client_protocol_table_names_every_kind_with_its_number_and_shape():
    found = rows("protocol.md")
    for kind, name, rest in found:
        assert KIND_NAMES.get(kind) == name, (kind, name)
        assert f"`[{kind}" in rest, f"{name}'s shape must start with its kind {kind}"
    assert {kind for kind, _, _ in found} == set(KIND_NAMES)


def test_the_cluster_table_names_every_kind_with_its_number_and_fields():
    found = rows("cluster.md")
    for kind, name, rest in found:
        assert kind in FIELDS, f"{name} ({kind}) is not a cluster kind"
        fields = [f.strip() for quoted in re.findall(r"`([^`]*)`", rest)
                  for f in quoted.split(",")]
        assert (name, tuple(fields)) == FIELDS[kind], (kind, name, fields)
    assert {kind for kind, _, _ in found} == set(FIELDS)
    assert not set(FIELDS) & set(KIND_NAMES)  # the two protocols' kinds never collide
