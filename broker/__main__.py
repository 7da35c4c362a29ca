"""``python -m broker`` is the ``rpcbus`` command."""

from .cli import main

main()
