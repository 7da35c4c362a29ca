"""What checking a JWT costs a node, in CPU per login, by key type and by refusal.

    python -m rpcbus.benchmarks.token_cost [--n 2000]

Runs ``Tokens.verify`` (broker/tokens.py, the node's check) in this process on
tokens made here: a good one per key type (Ed25519, P-256, RSA-3072), and the bad
ones a client may send (a stranger's signature, no kid; an unknown kid; too
long; malformed). Prints microseconds of CPU per check. A node remembers a
verified token by its digest for 5 minutes (broker/gate.py), so a reconnect
storm pays the signature once per token.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from rpcbus.broker.tokens import MAX_TOKEN, TokenError, Tokens, fingerprint, load_keys


def _cost(tokens: Tokens, token: str, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        try:
            tokens.verify(token)
        except TokenError:
            pass
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="checks per row")
    n = parser.parse_args().n
    signers: dict[str, tuple[Any, str]] = {
        "Ed25519": (ed25519.Ed25519PrivateKey.generate(), "EdDSA"),
        "P-256": (ec.generate_private_key(ec.SECP256R1()), "ES256"),
        "RSA-3072": (rsa.generate_private_key(65537, 3072), "RS256")}
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for label, (key, _) in signers.items():
            paths[label] = os.path.join(folder, f"{label}.pub")
            with open(paths[label], "wb") as f:
                f.write(key.public_key().public_bytes(
                    serialization.Encoding.PEM,
                    serialization.PublicFormat.SubjectPublicKeyInfo))
        tokens = Tokens(load_keys(paths))
    claims = {"sub": "app", "iss": "rpcbus", "aud": "rpcbus", "exp": time.time() + 3600,
              "call": ["billing.*", "users.get"], "provide": ["billing.*"]}
    rows = {f"good, {label}": jwt.encode(claims, key, algorithm=alg,
                                         headers={"kid": fingerprint(key.public_key())})
            for label, (key, alg) in signers.items()}
    stranger = ed25519.Ed25519PrivateKey.generate()
    rows["a stranger's signature, no kid (every EdDSA key tried)"] = jwt.encode(
        claims, stranger, algorithm="EdDSA")
    big = jwt.encode({**claims, "call": ["x" * (MAX_TOKEN * 3 // 4 - 400)]}, stranger,
                     algorithm="EdDSA")
    rows[f"a stranger's signature, {len(big)} characters (near the limit)"] = big
    rows["a kid this node does not hold"] = jwt.encode(
        claims, stranger, algorithm="EdDSA", headers={"kid": "0123456789abcdef"})
    rows[f"too long ({MAX_TOKEN + 1} characters)"] = "eyJ" + "a" * (MAX_TOKEN - 4) + ".b.c"
    rows["malformed"] = "eyJhbGciOi.not-a-token.x"
    print(f"{'token':58} {'µs CPU per check':>18}")
    for name, token in rows.items():
        print(f"{name:58} {_cost(tokens, token, n):18.1f}")


if __name__ == "__main__":
    main()
