"""``rpcbus token keygen`` and ``rpcbus token issue``: a signing key and the JWTs it signs,
for tests and small deployments (a larger one issues them from its identity service;
docs/security.md says which claims a node reads)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import click

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise click.ClickException(f"--ttl {text!r}: a duration such as 90s, 30m, 1h or 7d")
    return float(match[1]) * _UNITS[match[2] or "s"]


@click.group("token")
def token() -> None:
    """JWT tokens the nodes verify with public keys ([auth.token_keys])."""


@token.command("keygen")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="The private key file to write (PEM, mode 0600); the public key "
                   "goes beside it as OUT.pub.")
@click.option("--type", "kind", type=click.Choice(["ed25519", "p256", "rsa"]),
              default="ed25519", show_default=True, help="The key type.")
def keygen(out: str, kind: str) -> None:
    """Write a new signing key: keep OUT secret, give OUT.pub to the nodes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    from rpcbus.broker.tokens import fingerprint

    key: Any = (ed25519.Ed25519PrivateKey.generate() if kind == "ed25519" else
                ec.generate_private_key(ec.SECP256R1()) if kind == "p256" else
                rsa.generate_private_key(65537, 3072))
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        with open(out + ".pub", "xb") as f:
            f.write(public)
    except OSError as exc:
        raise click.ClickException(f"{exc.filename}: {exc.strerror} (a key file is never "
                                   "overwritten: choose another --out)") from None
    click.echo(f"wrote {out} (keep it secret: it signs tokens) and {out}.pub (give it to "
               f"the nodes: [auth.token_keys]); kid {fingerprint(key.public_key())}")


@token.command("issue")
@click.option("--key", "key_file", required=True, type=click.Path(dir_okay=False),
              help="The private key that signs (PEM; rpcbus token keygen).")
@click.option("--user", required=True, help="The user (the token's sub).")
@click.option("--call", multiple=True, metavar="GLOB", help="RPC names it may call (repeat).")
@click.option("--provide", multiple=True, metavar="GLOB",
              help="RPC names it may provide (repeat).")
@click.option("--publish", multiple=True, metavar="GLOB",
              help="Event topics it may emit to (repeat).")
@click.option("--subscribe", multiple=True, metavar="GLOB",
              help="Event topics it may subscribe to (repeat).")
@click.option("--presence", multiple=True, metavar="GLOB",
              help="Users whose presence it may see (repeat).")
@click.option("--role", multiple=True, metavar="NAME",
              help="A role of the nodes' [auth.roles] (repeat).")
@click.option("--ttl", default="1h", show_default=True,
              help="How long it is valid: 90s, 30m, 1h, 1d. Nodes refuse a token "
                   "that lives longer than their auth.token_max_ttl (a day by default).")
@click.option("--issuer", default="rpcbus", show_default=True,
              help="Its iss: the nodes' auth.token_issuer.")
@click.option("--audience", default="rpcbus", show_default=True,
              help="Its aud: the nodes' auth.token_audience.")
def issue(key_file: str, user: str, call: tuple[str, ...], provide: tuple[str, ...],
          publish: tuple[str, ...], subscribe: tuple[str, ...], presence: tuple[str, ...],
          role: tuple[str, ...], ttl: str, issuer: str, audience: str) -> None:
    """Print a JWT for USER, signed with KEY: connect(url, token=...)."""
    import jwt
    from cryptography.hazmat.primitives import serialization

    from rpcbus.broker.tokens import TokenConfigError, algorithms_for, fingerprint

    lifetime = _seconds(ttl)
    if not 0 < len(user) <= 128 or not user.isprintable():
        raise click.ClickException(f"--user {user[:40]!r}: 1-128 printable characters")
    try:
        with open(key_file, "rb") as f:
            data = f.read(1 << 16)
        if b"PUBLIC KEY" in data:
            raise click.ClickException(f"{key_file}: a public key; --key takes the private "
                                       "key that signs (its .pub goes to the nodes)")
        key: Any = serialization.load_pem_private_key(data, password=None)
        alg = algorithms_for(key)[0]
    except OSError as exc:
        raise click.ClickException(f"{key_file}: {exc.strerror}") from None
    except TypeError:
        raise click.ClickException(f"{key_file}: the key is encrypted; give an unencrypted "
                                   "one (rpcbus token keygen writes one)") from None
    except (ValueError, TokenConfigError) as exc:
        raise click.ClickException(f"{key_file}: not a usable private key ({exc})") from None
    now = int(time.time())
    claims: dict[str, Any] = {"sub": user, "iat": now, "exp": now + max(int(lifetime), 1)}
    if issuer:
        claims["iss"] = issuer
    if audience:
        claims["aud"] = audience
    for name, values in (("call", call), ("provide", provide), ("publish", publish),
                         ("subscribe", subscribe), ("presence", presence), ("roles", role)):
        if values:
            claims[name] = list(values)
    click.echo(jwt.encode(claims, key, algorithm=alg,
                          headers={"kid": fingerprint(key.public_key())}))
