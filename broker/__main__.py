"""``python -m rpcbus.broker`` is the ``rpcbus`` command."""

from rpcbus.broker import run

run()
