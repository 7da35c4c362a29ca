"""Provider weights for the weighted choice: the file ``rpcbus analyze`` recommends.

A node with ``rpc.weights_file`` set gives each of its providers of an rpc the
weight the file names for (rpc, provider name), else the file's ``default``
(1.0). A provider's chance on a call is its weight over the sum of the weights
of every provider of that rpc in the cluster: each node advertises the sum of
its providers' weights instead of their count (docs/cluster.md), so every node
must load the same file. Without a file every provider weighs 1.

The file (JSON, written by ``rpcbus analyze`` as ``weights.json``)::

    {"schema_version": 1, "generated_at": "...", "default": 1.0,
     "rpcs": {"billing.charge": {"billing-worker-1": 1.0, "billing-worker-2": 0.25}}}

Weights are finite numbers > 0 (a weight of 0 would make a provider unreachable
with nobody noticing; use a small weight, or stop the provider). A file that
breaks these rules raises ``WeightsError`` naming what is wrong: a node refuses
to start with it, and a node that finds it while reloading keeps the weights it
had (``WeightsFile.reload``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

SCHEMA_VERSION = 1


class WeightsError(ValueError):
    """A weights file that cannot be used; the text says where and why."""


class Weights:
    """Weights by (rpc, provider name). Pure."""

    __slots__ = ("rpcs", "default")

    def __init__(self, rpcs: dict[str, dict[str, float]], default: float = 1.0) -> None:
        self.rpcs = rpcs
        self.default = default

    def of(self, rpc: str, provider: str) -> float:
        named = self.rpcs.get(rpc)
        if named is None:
            return self.default
        return named.get(provider, self.default)

    @classmethod
    def parse(cls, doc: Any, where: str = "weights") -> "Weights":
        if not isinstance(doc, dict):
            raise WeightsError(f"{where}: a JSON object is expected")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise WeightsError(f"{where}: schema_version {version!r}, expected {SCHEMA_VERSION}")
        default = _weight(doc.get("default", 1.0), f"{where}: default")
        rpcs = doc.get("rpcs", {})
        if not isinstance(rpcs, dict):
            raise WeightsError(f"{where}: rpcs must be an object of rpc -> {{provider: weight}}")
        parsed: dict[str, dict[str, float]] = {}
        for rpc, named in rpcs.items():
            if not isinstance(named, dict):
                raise WeightsError(f"{where}: rpcs.{rpc} must be an object of provider -> weight")
            parsed[rpc] = {str(p): _weight(w, f"{where}: rpcs.{rpc}.{p}")
                           for p, w in named.items()}
        return cls(parsed, default)


def _weight(value: Any, where: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise WeightsError(f"{where}: a weight must be a finite number > 0, not {value!r}")
    return float(value)


def load(path: str) -> Weights:
    """Read and check a weights file; raises WeightsError (also for an unreadable file)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise WeightsError(f"{path}: {e}") from None
    return Weights.parse(doc, path)


class WeightsFile:
    """A weights file a node watches: ``reload()`` reads it again when it changed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = self._stat()
        self.weights = load(path)        # raises: a node does not start with a bad file
        self.reloads = 0
        self.reload_errors = 0

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def reload(self) -> Weights | None:
        """The new weights when the file changed and is valid; None when it did not change.
        Raises WeightsError when it changed into something unusable (the old weights stay)."""
        stamp = self._stat()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            self.weights = load(self.path)
        except WeightsError:
            self.reload_errors += 1
            raise
        self.reloads += 1
        return self.weights
