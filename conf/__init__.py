"""Shipped configuration: ``rpcbus.toml`` lists every node option with its default
(``rpcbus config --defaults`` prints it; a test keeps it equal to broker/config.py)."""
