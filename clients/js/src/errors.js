// Errors a caller sees, each with the stable wire `code` (docs/protocol.md, "Error codes").
// The same tree as the Python SDK's rpcbus.errors: catch RpcError for all of them.

export const CODES = Object.freeze([
  'NO_PROVIDER', 'RESPONSE_TIMEOUT', 'ACCEPT_TIMEOUT', 'PROVIDER_ERROR', 'PROVIDER_GONE', 'INVALID_MESSAGE',
  'NOT_AUTHENTICATED', 'PERMISSION_DENIED', 'RATE_LIMITED', 'CLUSTER_UNAVAILABLE',
  'SHUTTING_DOWN', 'OVERLOADED', 'CONNECTION_LOST', 'CONNECT_FAILED', 'PAYLOAD_TOO_LARGE',
  'LIMIT_EXCEEDED', 'BUSY',
])

/** A call or request failed; `code` is stable, `message` is for people. */
export class RpcError extends Error {
  // `.code` is stable, `.message` is for people (the node's text, or the code when it sent
  // none), as in the Python SDK; `String(err)` is "CODE: text", as Python's str(err)
  constructor (code, message = '') {
    super(message || code)
    this.name = this.constructor.name
    this.code = code
  }

  /** @deprecated the same as `.message` (before 0.2 `.message` began with the code) */
  get detail () { return this.message === this.code ? '' : this.message }

  toString () { return this.message === this.code ? this.code : `${this.code}: ${this.message}` }
}

const byCode = new Map()
function kind (name, code) {
  const cls = { [name]: class extends RpcError { constructor (message = '') { super(code, message) } } }[name]
  byCode.set(code, cls)
  return cls
}

// Codes a node answers only for a call that did not run (docs/protocol.md).
export const DID_NOT_RUN = Object.freeze(new Set(['NO_PROVIDER', 'SHUTTING_DOWN',
  'INVALID_MESSAGE', 'NOT_AUTHENTICATED', 'PERMISSION_DENIED', 'RATE_LIMITED',
  'CONNECT_FAILED', 'OVERLOADED']))

export const NoProviderError = kind('NoProviderError', 'NO_PROVIDER')
export const ResponseTimeoutError = kind('ResponseTimeoutError', 'RESPONSE_TIMEOUT')
/** A provider that may run a call before it accepts it (a deepstream client) did not
 * accept it in time: it may have run. A ResponseTimeoutError too. */
export class AcceptTimeoutError extends ResponseTimeoutError {
  constructor (message = '') {
    super(message || 'ACCEPT_TIMEOUT')
    this.code = 'ACCEPT_TIMEOUT'
  }
}
byCode.set('ACCEPT_TIMEOUT', AcceptTimeoutError)
export const ProviderError = kind('ProviderError', 'PROVIDER_ERROR')
export const ProviderGoneError = kind('ProviderGoneError', 'PROVIDER_GONE')
export const InvalidMessageError = kind('InvalidMessageError', 'INVALID_MESSAGE')
export const NotAuthenticatedError = kind('NotAuthenticatedError', 'NOT_AUTHENTICATED')
export const PermissionDeniedError = kind('PermissionDeniedError', 'PERMISSION_DENIED')
export const RateLimitedError = kind('RateLimitedError', 'RATE_LIMITED')
export const ClusterUnavailableError = kind('ClusterUnavailableError', 'CLUSTER_UNAVAILABLE')
export const ShuttingDownError = kind('ShuttingDownError', 'SHUTTING_DOWN')
/** Every provider of the name was busy: the node shed the call, or no slot came free
 * before its deadline. It did not run; `retryAfter` (ms) is the node's hint. */
export const OverloadedError = kind('OverloadedError', 'OVERLOADED')
export const ConnectionLostError = kind('ConnectionLostError', 'CONNECTION_LOST')
export const ConnectFailedError = kind('ConnectFailedError', 'CONNECT_FAILED')
export const PayloadTooLargeError = kind('PayloadTooLargeError', 'PAYLOAD_TOO_LARGE')
export const LimitExceededError = kind('LimitExceededError', 'LIMIT_EXCEEDED')
export const BusyError = kind('BusyError', 'BUSY')

export const APP_ERROR = 'APP_ERROR' // on the wire only: the application's code rides beside
export const MAX_APP_CODE = 128

/**
 * An application's error: throw it in a handler and the caller gets an AppError with the
 * same `code`, `message` and `data`, on any node and from either SDK. The code is the
 * application's own (1-128 characters, not one of rpcbus's CODES); it travels under the
 * wire code APP_ERROR, so no node or SDK ever acts on it (docs/protocol.md).
 */
const fromWire = Symbol('fromWire') // its code was checked where it was thrown

export class AppError extends RpcError {
  constructor (code, message = '', data = null, _from = undefined) {
    if (_from === fromWire) {
      // as received: another SDK's checks applied where it was thrown
    } else if (typeof code !== 'string' || code.length === 0 || code.length > MAX_APP_CODE) {
      throw new RangeError(`an AppError code is a string of 1-${MAX_APP_CODE} characters`)
    } else if (CODES.includes(code) || code === APP_ERROR) {
      throw new RangeError(`${code} is one of rpcbus's own codes; choose an application code of your own`)
    }
    super(code, message)
    this.data = data === undefined ? null : data
  }
}

/** The most specific error for a wire code (`detail`: an application error's
 * [code, data]); an unknown code gives a plain RpcError. */
export function errorFromCode (code, message = '', detail = undefined) {
  if (code === APP_ERROR && Array.isArray(detail) && detail.length === 2) {
    return new AppError(String(detail[0]), message, detail[1], fromWire)
  }
  const cls = byCode.get(code)
  if (!cls) return new RpcError(String(code), message)
  const err = new cls(message)
  if (cls === OverloadedError) err.retryAfter = typeof detail === 'number' && detail > 0 ? detail : 0
  return err
}

/** Thrown by a provider's handler to hand the call to another provider (REJECT). */
export class Reject extends Error {
  constructor (message = 'rejected') {
    super(message)
    this.name = 'Reject'
  }
}
