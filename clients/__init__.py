"""rpcbus Python SDK: ``connect`` to a node, ``provide`` RPCs, ``call`` them.

    import rpcbus

    async with rpcbus.connect("ws://127.0.0.1:6020") as c:
        await c.provide("math.add", lambda d: d["a"] + d["b"])
        print(await c.call("math.add", {"a": 1, "b": 2}, timeout=5.0))

The node is ``rpcbus.broker``, its Redis side ``rpcbus.cluster``, the offline analytics
``rpcbus.analytics``; importing this package imports none of them (docs/architecture.md).
"""

import logging as _logging

from rpcbus.calling import Reply
from rpcbus.client import CallContext, Client, Options, connect
from rpcbus.errors import (
    CODES,
    AcceptTimeoutError,
    AppError,
    BusyError,
    ClusterUnavailableError,
    ConnectFailedError,
    ConnectionLostError,
    InvalidMessageError,
    LimitExceededError,
    NoProviderError,
    NotAuthenticatedError,
    OverloadedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProviderError,
    ProviderGoneError,
    RateLimitedError,
    Reject,
    ResponseTimeoutError,
    RpcError,
    ShuttingDownError,
    error_from_code,
)
from rpcbus.found import ProviderInfo, RpcInfo
from rpcbus.streams import Stream
from rpcbus.sync import SyncClient, SyncStream, connect_sync

__version__ = "0.2.0"  # the one place: setup.cfg and ``rpcbus --version`` read it

# The SDK is a guest in the application: it logs through the standard ``logging`` module
# under ``rpcbus.*`` and prints nothing unless the application configures logging.
_logging.getLogger("rpcbus").addHandler(_logging.NullHandler())

__all__ = [
    "__version__", "AcceptTimeoutError", "AppError", "BusyError", "CODES", "CallContext", "Client",
    "ClusterUnavailableError",
    "ConnectFailedError", "ConnectionLostError", "InvalidMessageError", "LimitExceededError",
    "NoProviderError", "NotAuthenticatedError", "OverloadedError", "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProviderError", "ProviderGoneError", "ProviderInfo", "RateLimitedError", "Reject",
    "Reply", "RpcInfo",
    "ResponseTimeoutError",
    "Options", "RpcError", "ShuttingDownError", "Stream", "SyncClient", "SyncStream",
    "connect", "connect_sync",
    "error_from_code",
]
