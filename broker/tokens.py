"""JWT tokens the nodes verify without a user table: who the client is and what it
may do, signed by a key the operator holds; the nodes hold only public keys.

A node with ``[auth.token_keys]`` (a label per PEM public key file, several at once
for rotation) takes an AUTH token that is a JWT (three dot-separated base64url
parts) as one: it verifies the signature with the key the header's ``kid`` names
(the key's fingerprint, ``fingerprint``, or its label) or, without a ``kid``, with
each key whose algorithm the header names. Only asymmetric algorithms, each bound
to its key's type: EdDSA (Ed25519), ES256/ES384/ES512 (P-256/384/521),
RS256/384/512 and PS256/384/512 (RSA of 2048 bits or more); ``none`` and HMAC are
refused before any work. Then the claims:

- ``exp`` (required; seconds since the epoch) and ``nbf`` if present, with
  ``auth.token_leeway`` seconds of slack for clocks; ``exp`` at most
  ``auth.token_max_ttl`` from now (a token that lives longer is refused);
- ``iss`` equal to ``auth.token_issuer`` and ``aud`` (a string or a list) holding
  ``auth.token_audience``, each checked unless configured empty;
- ``sub``: the user, 1-128 characters;
- ``call``, ``provide``, ``publish``, ``subscribe``, ``presence``, ``roles`` (names
  in ``[auth.roles]``) and the limits
  ``max_connections``, ``rate_messages``, ``rate_bytes``, ``max_provided``: the
  same keys, in the same form, as a ``[auth.users.NAME]`` table.

Pure but for ``load_keys`` (reads the key files): the clock comes in as ``now``.
A token is refused with ``TokenError`` whose text says why in one line (the
client is told it); the CPU one costs is bounded: at most ``MAX_TOKEN``
characters are looked at and at most ``MAX_KEYS`` signatures checked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import get_default_algorithms

MAX_TOKEN = 8192         # characters of a JWT looked at; a longer one is refused unread
MAX_KEYS = 16            # public keys a node holds at once
MAX_PATTERNS = 1000      # glob patterns and roles a token may carry, together
MIN_RSA_BITS = 2048
CLAIM_KEYS = frozenset({"call", "provide", "publish", "subscribe", "presence", "roles",
                        "max_connections", "rate_messages", "rate_bytes", "max_provided"})
_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
_RSA = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_ALGORITHMS = {alg: verifier for alg, verifier in get_default_algorithms().items()
               if alg in ("EdDSA", *_CURVES.values(), *_RSA)}  # PyJWT's signature checks


class TokenError(ValueError):
    """A token refused; the text says why, in one line. ``lasting``: the same token will
    be refused again until the configuration changes (not so for one not valid yet)."""

    def __init__(self, reason: str, lasting: bool = True) -> None:
        super().__init__(reason)
        self.lasting = lasting


class TokenConfigError(ValueError):
    """A key in ``[auth.token_keys]`` that cannot be used; the text names it."""


@dataclass(frozen=True)
class TokenKey:
    label: str                    # its name in [auth.token_keys]
    kid: str                      # its fingerprint: what `rpcbus token issue` puts in kid
    key: Any                      # the public key (cryptography)
    algorithms: tuple[str, ...]   # the JWT algorithms it verifies


@dataclass(frozen=True)
class Grant:
    """What a verified token grants: its user, the claims that give rights, and what a
    reload checks again (the key, issuer and audience it was verified under)."""

    user: str
    expires: float                # seconds since the epoch
    kid: str                      # the fingerprint of the key that verified it
    issuer: Any
    audience: Any
    claims: Mapping[str, Any]     # the CLAIM_KEYS it carries


def looks_like_jwt(token: str) -> bool:
    """A JWT in compact form (what else a token may be is a static token, which is
    URL-safe base64 without dots)."""
    return token.count(".") == 2


def fingerprint(public_key: Any) -> str:
    """16 hex digits of the SHA-256 of the key's SubjectPublicKeyInfo: the ``kid``."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


def algorithms_for(key: Any) -> tuple[str, ...]:
    """The JWT algorithms a public (or private) key of this type signs or verifies;
    TokenConfigError for a type or size that is not accepted."""
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return ("EdDSA",)
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        alg = _CURVES.get(key.curve.name)
        if alg is None:
            raise TokenConfigError(f"curve {key.curve.name} is not accepted "
                                   f"(use P-256, P-384 or P-521, or Ed25519)")
        return (alg,)
    if isinstance(key, (rsa.RSAPublicKey, rsa.RSAPrivateKey)):
        if key.key_size < MIN_RSA_BITS:
            raise TokenConfigError(f"an RSA key of {key.key_size} bits: "
                                   f"{MIN_RSA_BITS} at least")
        return _RSA
    raise TokenConfigError("not an Ed25519, EC or RSA key")


def load_keys(paths: Mapping[str, Any]) -> dict[str, TokenKey]:
    """The keys of ``[auth.token_keys]`` (label -> path of a PEM public key), by
    fingerprint; TokenConfigError naming the first that cannot be used."""
    if len(paths) > MAX_KEYS:
        raise TokenConfigError(f"{len(paths)} keys: {MAX_KEYS} at most")
    keys: dict[str, TokenKey] = {}
    for label, path in paths.items():
        where = f"auth.token_keys.{label}"
        if not isinstance(path, str) or not path:
            raise TokenConfigError(f"{where}: the path of a PEM public key file")
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 16)
        except OSError as exc:
            raise TokenConfigError(f"{where}: {path}: {exc.strerror or exc}") from None
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError:
            hint = (" (that is a private key: give the node only the public one, "
                    "`rpcbus token keygen` writes it beside)" if b"PRIVATE KEY" in data
                    else "")
            raise TokenConfigError(f"{where}: {path}: not a PEM public key{hint}") from None
        try:
            algorithms = algorithms_for(key)
        except TokenConfigError as exc:
            raise TokenConfigError(f"{where}: {path}: {exc}") from None
        kid = fingerprint(key)
        if kid in keys:
            raise TokenConfigError(f"{where}: the same key as auth.token_keys."
                                   f"{keys[kid].label}")
        keys[kid] = TokenKey(str(label), kid, key, algorithms)
    return keys


class Tokens:
    """The token checks of one configuration: its keys, issuer, audience and leeway."""

    def __init__(self, keys: Mapping[str, TokenKey], issuer: str = "rpcbus",
                 audience: str = "rpcbus", leeway: float = 30.0,
                 max_ttl: float = 86_400.0) -> None:
        self.keys = dict(keys)
        self.issuer, self.audience, self.leeway = issuer, audience, leeway
        self.max_ttl = max_ttl  # how long a token may still live when presented
        self._by_label = {k.label: k for k in self.keys.values()}

    def verify(self, token: str, now: float | None = None) -> Grant:
        """The grant of ``token`` at ``now`` (seconds since the epoch; the wall clock if
        None); TokenError saying why it is refused. The token is judged by its size, then
        its header (algorithm, ``kid``) before any signature work; it is decoded once,
        whatever the number of keys tried, and its claims read only once a signature
        verified (``parse``)."""
        unread = too_long(token)
        if unread is not None:
            raise unread
        if not self.keys:
            raise TokenError("this node takes no JWT tokens (no auth.token_keys)")
        header, payload, signed, signature = parse(token)
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg.lower() == "none":
            raise TokenError("token algorithm none is not accepted: it must be signed")
        if kid is not None:
            key = self.keys.get(kid) if isinstance(kid, str) else None
            if key is None and isinstance(kid, str):
                key = self._by_label.get(kid)
            if key is None:
                raise TokenError(f"token signed by a key this node does not hold "
                                 f"(kid {str(kid)[:40]!r})")
            candidates = [key]
        else:
            candidates = list(self.keys.values())
        candidates = [k for k in candidates if alg in k.algorithms]
        if not candidates:
            accepted = sorted({a for k in self.keys.values() for a in k.algorithms})
            raise TokenError(f"token algorithm {alg[:20]!r} is not accepted here "
                             f"({', '.join(accepted)})")
        if "crit" in header:  # extensions a verifier must understand (RFC 7515 4.1.11)
            raise TokenError("token header crit: no extension is understood here")
        verifier = _ALGORITHMS[alg]
        for key in candidates:
            if verifier.verify(signed, key.key, signature):
                claims = self._claims(payload)
                return self._grant({**claims, "kid": key.kid},
                                   now if now is not None else time.time())
        raise TokenError("token signature does not verify with this node's keys")

    def _claims(self, payload: bytes) -> dict[str, Any]:
        """The claims of a token whose signature verified: ``exp`` and ``sub`` present,
        ``iss`` and ``aud`` as configured (each checked unless configured empty)."""
        try:
            claims = json.loads(payload)
        except (ValueError, RecursionError):
            raise TokenError("token malformed: its claims are not JSON") from None
        if not isinstance(claims, dict):
            raise TokenError("token malformed: its claims are not a JSON object")
        for claim in ("exp", "sub", *(("iss",) if self.issuer else ()),
                      *(("aud",) if self.audience else ())):
            if claim not in claims:
                raise TokenError(f"token has no {claim} claim")
        if self.issuer and claims["iss"] != self.issuer:
            raise TokenError(f"token issuer is not {self.issuer!r}")
        if self.audience:
            aud = claims["aud"]
            if not (aud == self.audience or (isinstance(aud, list) and self.audience in aud
                                             and all(isinstance(a, str) for a in aud))):
                raise TokenError(f"token audience is not {self.audience!r}")
        return claims

    def _grant(self, claims: dict[str, Any], now: float) -> Grant:
        exp, nbf, sub = claims.get("exp"), claims.get("nbf"), claims.get("sub")
        if not isinstance(exp, (int, float)) or isinstance(exp, bool):
            raise TokenError("token claim exp: must be a number (seconds since the epoch)")
        if now > exp + self.leeway:
            raise expired(exp)
        if exp - now > self.max_ttl + self.leeway:  # a stolen one would serve for ever
            raise TokenError(f"token lives too long: it expires at {_when(exp)}, more than "
                             f"auth.token_max_ttl ({self.max_ttl:g} s) from now")
        if nbf is not None:
            if not isinstance(nbf, (int, float)) or isinstance(nbf, bool):
                raise TokenError("token claim nbf: must be a number (seconds since the epoch)")
            if now < nbf - self.leeway:
                raise TokenError(f"token not valid before {_when(nbf)}", lasting=False)
        if not isinstance(sub, str) or not 0 < len(sub) <= 128 or not sub.isprintable():
            raise TokenError("token claim sub: the user, 1-128 printable characters")
        rights = {k: claims[k] for k in CLAIM_KEYS if k in claims}
        patterns = 0
        for key in ("call", "provide", "publish", "subscribe", "presence", "roles"):
            value = rights.get(key, [])
            if not isinstance(value, list) or not all(
                    isinstance(v, str) and 0 < len(v) <= 256 for v in value):
                raise TokenError(f"token claim {key}: must be a list of strings")
            patterns += len(value)
        if patterns > MAX_PATTERNS:
            raise TokenError(f"token carries {patterns} patterns: {MAX_PATTERNS} at most")
        for key in ("max_connections", "rate_messages", "rate_bytes", "max_provided"):
            value = rights.get(key)
            if value is not None and (type(value) is not int or value < 0):
                raise TokenError(f"token claim {key}: must be a whole number, 0 or more")
        return Grant(sub, float(exp) + self.leeway, claims["kid"], claims.get("iss"),
                     claims.get("aud"), rights)

    def holds(self, grant: Grant) -> str:
        """Why ``grant`` no longer stands under this configuration ("" when it does):
        its key removed, or the issuer or audience changed (a reload)."""
        if grant.kid not in self.keys:
            return "the key that signed its token was removed"
        if self.issuer and grant.issuer != self.issuer:
            return f"the token's issuer is not {self.issuer!r}"
        if self.audience and not (grant.audience == self.audience or (
                isinstance(grant.audience, list) and self.audience in grant.audience)):
            return f"the token's audience is not {self.audience!r}"
        return ""


def too_long(token: str) -> TokenError | None:
    """The refusal of a token over ``MAX_TOKEN`` characters (None: not too long)."""
    if len(token) <= MAX_TOKEN:
        return None
    return TokenError(f"token too long ({len(token)} characters; {MAX_TOKEN} at most)")


def parse(token: str) -> tuple[dict[str, Any], bytes, bytes, bytes]:
    """A compact JWS's header, payload, signing input and signature, each segment decoded
    once and strictly (the base64url alphabet, no padding, canonical trailing bits);
    TokenError "token malformed" otherwise. PyJWT's own reading looks at every character
    in Python once per key tried: 1.5 ms for a refused 7.9 kB token with one key, 5.8 ms
    with eight (benchmarks/token_cost.py)."""
    segments = token.split(".")
    if len(segments) != 3:
        raise TokenError("token malformed: not three dot-separated parts")
    try:
        raw = [_segment(s) for s in segments]
        header = json.loads(raw[0])
    except (ValueError, RecursionError):
        raise TokenError("token malformed: a part is not base64url, or its header not "
                         "JSON") from None
    if not isinstance(header, dict):
        raise TokenError("token malformed: its header is not a JSON object")
    if header.get("b64", True) is not True:
        raise TokenError("token malformed: a detached payload (b64) is not accepted")
    signed = f"{segments[0]}.{segments[1]}".encode("ascii")
    return header, raw[1], signed, raw[2]


def _segment(segment: str) -> bytes:
    """One base64url segment, decoded; ValueError unless it is canonical."""
    if not _BASE64URL.fullmatch(segment) or len(segment) % 4 == 1:
        raise ValueError(segment[:20])
    data = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    if base64.urlsafe_b64encode(data).rstrip(b"=") != segment.encode("ascii"):
        raise ValueError(segment[:20])  # non-zero trailing bits: another token's twin
    return data


def expired(exp: float) -> TokenError:
    """The refusal of a token that expired at ``exp``."""
    return TokenError(f"token expired at {_when(exp)}")


def _when(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # beyond any calendar (exp = 1e308)
        return f"{t:g} s after 1970"
