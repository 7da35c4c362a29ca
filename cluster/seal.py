"""Sealing cluster batches so that access to Redis alone gives no power over the nodes.

Pure (no I/O). One PUBLISH carries one sealed batch (cluster/messages.py makes
the batch)::

    msgpack [1, mode, key_id, ts_ms, seq, body, tag]

- ``mode`` 1 = sign: ``body`` is the batch, ``tag`` = HMAC-SHA256 over the
  topic, the header ``[1, mode, key_id, ts_ms, seq]`` and the body.
- ``mode`` 2 = encrypt: ``body`` = 12-byte fresh random nonce + AES-256-GCM
  ciphertext of the batch (its 16-byte tag included), with the topic and the
  header as associated data; ``tag`` is empty.
- ``ts_ms``: the sender's wall clock; ``seq``: a number that grows with every
  batch the sender seals (it starts at the sender's start time in µs, so a
  restarted sender continues above its old numbers).

A receiver opens a batch only when its mode is the configured one (no
downgrade), its key id is one of the configured keys (several at once, so
keys rotate without downtime: add the new key everywhere, switch ``key_id``,
then drop the old key), the seal verifies, and ``ts_ms`` lies within
``max_skew`` of its own clock, and no earlier than ``START_SLACK`` before the
receiver started (a replay window is empty at start: this keeps batches captured
before a restart out of the new process). Binding the topic stops a batch sent
to one node from being replayed to another. After decoding, ``ReplayGuard`` refuses a
``(sender, seq)`` seen before: it keeps, per sender, the highest seq and a
window of the last ``WINDOW`` numbers (batches of concurrent PUBLISH rounds may
arrive out of order), and forgets senders silent for longer than the skew.
"""

from __future__ import annotations

import base64
import hmac
import os
import time
from typing import Any, Mapping, cast

import msgpack
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SIGN, ENCRYPT = 1, 2
START_SLACK = 2.0   # s: batches stamped earlier than this before the receiver started are refused
MODES = {"sign": SIGN, "encrypt": ENCRYPT}
WINDOW = 4096


class SealError(ValueError):
    """A batch that must not be acted on (the reason is a short word for counters)."""


class SkewError(SealError):
    """A genuine batch (its seal verified) stamped more than ``max_skew`` away from this
    clock: a node whose clock is off (or this one's), or an old batch replayed. ``batch``
    and ``offset_s`` (its stamp minus this clock) let the receiver say whose clock it is,
    never act on it."""

    def __init__(self, batch: bytes, offset_s: float) -> None:
        super().__init__("skew")
        self.batch = batch
        self.offset_s = offset_s


def new_key() -> str:
    """A fresh random 256-bit key, base64, for ``[cluster.keys]``."""
    return base64.b64encode(os.urandom(32)).decode()


def load_keys(keys: Mapping[str, Any], key_id: str) -> dict[str, bytes]:
    """Decode ``[cluster.keys]`` (id -> base64 of 32 bytes); ``key_id`` must be one."""
    if not keys:
        raise SealError("a sealed cluster needs at least one key (`rpcbus new-key`)")
    out: dict[str, bytes] = {}
    for kid, text in keys.items():
        if not kid or len(kid) > 32:
            raise SealError(f"key id {kid!r}: 1-32 characters")
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise SealError(f"key {kid!r}: not base64") from None
        if len(raw) != 32:
            raise SealError(f"key {kid!r}: must be 32 bytes (base64 of 32 random bytes)")
        out[kid] = raw
    if key_id not in out:
        raise SealError(f"cluster.key_id {key_id!r} is not among the keys")
    return out


class Sealer:
    """Seals outgoing and opens incoming batches for one node."""

    def __init__(self, mode: str, keys: Mapping[str, Any], key_id: str,
                 max_skew: float) -> None:
        self.mode = MODES[mode]
        self.keys = load_keys(keys, key_id)
        self.key_id = key_id
        self.max_skew_ms = int(max_skew * 1000)
        self._seq = time.time_ns() // 1000
        # sealed before this process started (START_SLACK for clocks that disagree): not
        # for this process, whatever its replay window (empty at start) says
        self.not_before_ms = time.time_ns() // 1_000_000 - int(START_SLACK * 1000)
        self._aead = {kid: AESGCM(key) for kid, key in self.keys.items()}

    def seal(self, topic: str, batch: bytes) -> bytes:
        self._seq += 1
        header = [1, self.mode, self.key_id, time.time_ns() // 1_000_000, self._seq]
        aad = topic.encode() + msgpack.packb(header)
        if self.mode == SIGN:
            tag = hmac.digest(self.keys[self.key_id], aad + batch, "sha256")
            return cast(bytes, msgpack.packb(header + [batch, tag]))
        nonce = os.urandom(12)
        body = nonce + self._aead[self.key_id].encrypt(nonce, batch, aad)
        return cast(bytes, msgpack.packb(header + [body, b""]))

    def open(self, topic: str, payload: bytes) -> tuple[bytes, int]:
        """The batch inside ``payload`` and its seq; raises SealError saying why not."""
        try:
            obj = msgpack.unpackb(payload)
        except Exception:  # msgpack raises several types; all mean "not sealed"
            raise SealError("unsealed") from None
        if (type(obj) is not list or len(obj) != 7 or obj[0] != 1 or type(obj[1]) is not int
                or type(obj[2]) is not str or type(obj[3]) is not int
                or type(obj[4]) is not int or type(obj[5]) is not bytes
                or type(obj[6]) is not bytes):
            raise SealError("unsealed")
        mode, kid, ts, seq, body, tag = obj[1:]
        if mode != self.mode:
            raise SealError("wrong_mode")
        key = self.keys.get(kid)
        if key is None:
            raise SealError("unknown_key")
        aad = topic.encode() + msgpack.packb(obj[:5])
        if mode == SIGN:
            if not hmac.compare_digest(hmac.digest(key, aad + body, "sha256"), tag):
                raise SealError("bad_seal")
            batch = body
        else:
            try:
                batch = self._aead[kid].decrypt(body[:12], body[12:], aad)
            except Exception:  # InvalidTag, or a body too short to hold a nonce
                raise SealError("bad_seal") from None
        offset = ts - time.time_ns() // 1_000_000
        if abs(offset) > self.max_skew_ms:
            raise SkewError(batch, offset / 1000)
        if ts < self.not_before_ms:
            raise SealError("before_start")
        return batch, seq


class ReplayGuard:
    """Per sender: refuses a seq already seen, or too old for the window."""

    def __init__(self, max_skew: float) -> None:
        self.forget_after = 2 * max_skew
        # sender (its name and incarnation) -> [highest, bitmap, last_seen]
        self._seen: dict[Any, list[Any]] = {}

    def fresh(self, sender: Any, seq: int, now: float) -> bool:
        entry = self._seen.get(sender)
        if entry is None:
            if len(self._seen) > 64:
                self._forget(now)
            self._seen[sender] = [seq, 1, now]
            return True
        highest, bits = entry[0], entry[1]
        entry[2] = now
        if seq > highest:
            shift = seq - highest
            entry[0] = seq
            entry[1] = ((bits << shift) | 1) & ((1 << WINDOW) - 1) if shift < WINDOW else 1
            return True
        back = highest - seq
        if back >= WINDOW or bits >> back & 1:
            return False
        entry[1] = bits | (1 << back)
        return True

    def _forget(self, now: float) -> None:
        for sender in [s for s, e in self._seen.items() if now - e[2] > self.forget_after]:
            del self._seen[sender]
