"""``call_all``: one request to every provider of a name, a reply from each. Pure.

The router (broker/router.py ``request_all``) makes an ``AllCall`` for the caller and one
child call per target: each provider on this node, and each other node that provides the
name (which runs it on each of its own providers and sends their replies back). The
children are ordinary calls of a ``Gather`` peer, so they are routed, acknowledged,
timed and cancelled as calls are, each pinned to its target: one that is refused or
lost is not moved to another provider (every provider runs it at most once). As each
child ends, ``Gather`` turns its outcome into a REPLY for the caller, named by the
provider and its node; when every child has ended, ``max_replies`` replies went out, or
the deadline passed (the children time out with it), the caller gets RESPONSE with the
number of replies, and the children still under way are cancelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpcbus.protocol import ERROR, RESPONSE

if TYPE_CHECKING:
    from rpcbus.broker.router import Call, Router


class Gather:
    """The children's caller: each child's outcome becomes a REPLY of its ``AllCall``.
    A ``Caller`` of the router (broker/peers.py), never a provider."""

    is_node = False
    closed = False
    origin = ""

    def __init__(self, router: "Router", parent: "Call", max_replies: int) -> None:
        self.router = router
        self.parent = parent
        self.label = parent.caller.label           # providers see the caller
        self.user_name = parent.caller.user_name
        self.inflight = 0
        self.calls: dict[int, Call] = {}           # the children under way, by index
        # each child's target: (provider label, node name, a whole node?)
        self.targets: dict[int, tuple[str, str, bool]] = {}
        self.max_replies = max_replies
        self.replies = 0
        self.replied: set[tuple[str, str]] = set()  # (node, provider) of REPLYs from nodes
        self.fanning = False  # children are being made: none ends the call_all yet
        self.done = False

    def send(self, msg: list[Any]) -> None:
        """A child's outcome (it has left every table): a provider's answer or error is
        its REPLY; a node's RESPONSE says its providers' REPLYs all came (its error, a
        REPLY for the node)."""
        provider, node, whole = self.targets[msg[1]]
        if not self.done:
            if msg[0] == RESPONSE:
                if not whole:
                    self.router.reply_of(self, provider, node, msg[2], None)
            elif msg[0] == ERROR:
                self.router.reply_of(self, "" if whole else provider, node, None, msg[2:])
        if not self.calls and not self.fanning:
            self.router.gathered(self)
