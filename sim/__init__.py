"""A deterministic simulator of an rpcbus cluster, built from the real cores.

``python -m rpcbus.sim --seeds N`` runs N seeded schedules (rpcbus.sim.run): nodes,
providers and callers on one virtual clock, a simulated Redis and client links
that delay, replay, lose, partition, pause and restart, with every call checked
against the promise. A failing seed prints its violations and the command that
replays it alone. Nothing here opens a socket or sleeps.
"""
