"""A broker node: sessions, routing, the CLI (extra ``[node]``)."""

from __future__ import annotations

import sys


def run() -> None:
    """The ``rpcbus`` command; without the node's dependencies, one line says what to do."""
    try:
        from rpcbus.broker.cli import main
    except ImportError as exc:
        sys.exit(f"rpcbus: the command needs {exc.name}, a dependency of the node: "
                 "pip install 'rpcbus[node]'")
    main()
