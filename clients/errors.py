"""Errors raised by the SDK, each carrying a stable string ``code`` from the wire.

The tree::

    RpcError                      code: any string; the root, catch it to catch them all
    ├── NoProviderError           NO_PROVIDER        nobody provides the name (or all refused)
    ├── ResponseTimeoutError      RESPONSE_TIMEOUT   no answer within the call's deadline
    │   │                                            (also a TimeoutError)
    │   └── AcceptTimeoutError    ACCEPT_TIMEOUT     a provider that may run a call before
    │                                                it accepts (a deepstream client) did
    │                                                not accept it in time: it may have run
    ├── ProviderError             PROVIDER_ERROR     the provider's handler raised
    ├── ProviderGoneError         PROVIDER_GONE      the provider left after accepting the call
    ├── InvalidMessageError       INVALID_MESSAGE    the node refused what we sent
    ├── NotAuthenticatedError     NOT_AUTHENTICATED  no or failed AUTH
    ├── PermissionDeniedError     PERMISSION_DENIED
    ├── RateLimitedError          RATE_LIMITED
    ├── ClusterUnavailableError   CLUSTER_UNAVAILABLE
    ├── ShuttingDownError         SHUTTING_DOWN      the node is draining
    ├── OverloadedError           OVERLOADED         every provider was busy: shed, or no
    │                                                slot in time (not run; safe to retry
    │                                                after ``retry_after`` seconds)
    ├── PayloadTooLargeError      PAYLOAD_TOO_LARGE  the call's data or its answer is over
    │                                                the node's frame limit (never sent)
    ├── LimitExceededError        LIMIT_EXCEEDED     more names provided than the node allows
    ├── BusyError                 BUSY               the node cannot check a login now: retry
    ├── ConnectFailedError        CONNECT_FAILED     no URL could be connected to (the SDK;
    │                                                also a ConnectionError)
    ├── ConnectionLostError       CONNECTION_LOST    the connection dropped or the client was
    │                                                closed (the SDK; also a ConnectionError)
    └── AppError                  the application's  a provider's handler raised it: its own
                                  own code           ``code``, ``message`` and ``data``

So ``except TimeoutError`` and ``except ConnectionError`` catch what they would for any
other network library.

Application codes never collide with rpcbus's: an ``AppError`` travels under the
wire code ``APP_ERROR`` with the application's code beside it (docs/protocol.md),
so neither nodes nor SDKs ever act on it (it is never taken for "did not run"),
and ``AppError`` refuses a code that is one of rpcbus's own. Any other exception
a handler raises answers ``PROVIDER_ERROR``, even an ``RpcError`` from a call the
handler made itself: the outer call ran.

``Reject`` is not an error a caller sees: a provider's handler raises it to hand
the call to another provider.
"""

from __future__ import annotations

from typing import Any

NO_PROVIDER = "NO_PROVIDER"
RESPONSE_TIMEOUT = "RESPONSE_TIMEOUT"
ACCEPT_TIMEOUT = "ACCEPT_TIMEOUT"
PROVIDER_ERROR = "PROVIDER_ERROR"
PROVIDER_GONE = "PROVIDER_GONE"
INVALID_MESSAGE = "INVALID_MESSAGE"
NOT_AUTHENTICATED = "NOT_AUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
RATE_LIMITED = "RATE_LIMITED"
CLUSTER_UNAVAILABLE = "CLUSTER_UNAVAILABLE"
SHUTTING_DOWN = "SHUTTING_DOWN"
CONNECTION_LOST = "CONNECTION_LOST"
CONNECT_FAILED = "CONNECT_FAILED"
PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
BUSY = "BUSY"
OVERLOADED = "OVERLOADED"
APP_ERROR = "APP_ERROR"  # on the wire only: the application's code travels beside it
MAX_APP_CODE = 128       # characters of an application's error code

#: Codes a node answers only for a call that did not run (docs/protocol.md): sending
#: it again cannot make it run twice.
DID_NOT_RUN = frozenset({NO_PROVIDER, SHUTTING_DOWN, INVALID_MESSAGE, NOT_AUTHENTICATED,
                         PERMISSION_DENIED, RATE_LIMITED, CONNECT_FAILED, OVERLOADED})


class RpcError(Exception):
    """A call or request failed; ``code`` is stable, ``message`` is for people."""

    code: str = "RPC_ERROR"

    def __init__(self, code: str | None = None, message: str = "") -> None:
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code}: {message}" if message else self.code)


class NoProviderError(RpcError):
    code = NO_PROVIDER


class ResponseTimeoutError(RpcError, TimeoutError):
    code = RESPONSE_TIMEOUT


class AcceptTimeoutError(ResponseTimeoutError):
    code = ACCEPT_TIMEOUT


class ProviderError(RpcError):
    code = PROVIDER_ERROR


class ProviderGoneError(RpcError):
    code = PROVIDER_GONE


class InvalidMessageError(RpcError):
    code = INVALID_MESSAGE


class NotAuthenticatedError(RpcError):
    code = NOT_AUTHENTICATED


class PermissionDeniedError(RpcError):
    code = PERMISSION_DENIED


class RateLimitedError(RpcError):
    code = RATE_LIMITED


class ClusterUnavailableError(RpcError):
    code = CLUSTER_UNAVAILABLE


class ShuttingDownError(RpcError):
    code = SHUTTING_DOWN


class OverloadedError(RpcError):
    """Every provider of the name was busy: the node shed the call, or no slot came free
    before its deadline. It did not run; ``retry_after`` (seconds) is the node's hint of
    how long calls wait there now."""
    code = OVERLOADED
    retry_after: float = 0.0


class ConnectionLostError(RpcError, ConnectionError):
    code = CONNECTION_LOST


class ConnectFailedError(RpcError, ConnectionError):
    code = CONNECT_FAILED


class PayloadTooLargeError(RpcError):
    code = PAYLOAD_TOO_LARGE


class LimitExceededError(RpcError):
    code = LIMIT_EXCEEDED


class BusyError(RpcError):
    """AUTH_FAIL BUSY: the node's password checks are all taken; the SDK retries."""
    code = BUSY


_BY_CODE: dict[str, type[RpcError]] = {
    cls.code: cls
    for cls in (
        NoProviderError,
        ResponseTimeoutError,
        AcceptTimeoutError,
        ProviderError,
        ProviderGoneError,
        InvalidMessageError,
        NotAuthenticatedError,
        PermissionDeniedError,
        RateLimitedError,
        ClusterUnavailableError,
        ShuttingDownError,
        OverloadedError,
        ConnectionLostError,
        ConnectFailedError,
        PayloadTooLargeError,
        LimitExceededError,
        BusyError,
    )
}

#: Every code of rpcbus's own a caller may see, in the order docs/protocol.md lists them.
CODES = tuple(_BY_CODE)


class AppError(RpcError):
    """An application's error: raise it in a handler and the caller gets an ``AppError``
    with the same ``code``, ``message`` and ``data`` (anything msgpack carries), on
    any node and from either SDK.

    ``code`` is the application's: a non-empty string of at most 128 characters that
    is not one of rpcbus's own codes (``CODES``, ``APP_ERROR``); ValueError otherwise.
    """

    def __init__(self, code: str, message: str = "", data: Any = None) -> None:
        if type(code) is not str or not 0 < len(code) <= MAX_APP_CODE:
            raise ValueError(f"an AppError code is a string of 1-{MAX_APP_CODE} characters")
        if code in _BY_CODE or code == APP_ERROR:
            raise ValueError(f"{code} is one of rpcbus's own codes; choose an application "
                             f"code of your own")
        super().__init__(code, message)
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (and copies) with its data
        return (type(self), (self.code, self.message, self.data))


def app_error_detail(exc: AppError) -> list[Any]:
    """The wire's detail for an AppError: ``[code, data]``."""
    return [exc.code, exc.data]


def error_from_code(code: str, message: str = "", detail: Any = None) -> RpcError:
    """The most specific error for a wire code; unknown codes give a plain RpcError.
    ``APP_ERROR`` with its ``detail`` ``[code, data]`` gives that ``AppError``."""
    if code == APP_ERROR and type(detail) is list and len(detail) == 2:
        app = AppError.__new__(AppError)  # the code was checked where it was raised
        RpcError.__init__(app, str(detail[0]), message)
        app.data = detail[1]
        return app
    cls = _BY_CODE.get(code)
    if cls is None:
        return RpcError(code, message)
    exc = cls(None, message)
    if cls is OverloadedError and type(detail) is int and detail > 0:
        exc.retry_after = detail / 1000  # type: ignore[attr-defined]  # OverloadedError's
    return exc


class Reject(Exception):
    """Raised by a provider's handler to hand the call to another provider."""
