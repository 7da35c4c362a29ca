"""``python -m rpcbus.broker`` is the ``rpcbus`` command."""

from . import run

run()
