"""rpcbus Python SDK: ``connect`` to a node, ``provide`` RPCs, ``call`` them.

    import clients

    async with clients.connect("ws://127.0.0.1:6020") as c:
        await c.provide("math.add", lambda d: d["a"] + d["b"])
        print(await c.call("math.add", {"a": 1, "b": 2}, timeout=5.0))
"""

from .client import CallContext, Client, connect
from .errors import (
    CODES,
    BusyError,
    ClusterUnavailableError,
    ConnectionLostError,
    InvalidMessageError,
    LimitExceededError,
    NoProviderError,
    NotAuthenticatedError,
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

__all__ = [
    "BusyError", "CODES", "CallContext", "Client", "ClusterUnavailableError",
    "ConnectionLostError", "InvalidMessageError", "LimitExceededError", "NoProviderError",
    "NotAuthenticatedError", "PayloadTooLargeError", "PermissionDeniedError", "ProviderError",
    "ProviderGoneError", "RateLimitedError", "Reject", "ResponseTimeoutError", "RpcError",
    "ShuttingDownError", "connect", "error_from_code",
]
