// Errors a caller sees, each with the stable wire `code` (docs/protocol.md, "Error codes").
// The same tree as the Python SDK's rpcbus.errors: catch RpcError for all of them.

export const CODES = Object.freeze([
  'NO_PROVIDER', 'RESPONSE_TIMEOUT', 'PROVIDER_ERROR', 'PROVIDER_GONE', 'INVALID_MESSAGE',
  'NOT_AUTHENTICATED', 'PERMISSION_DENIED', 'RATE_LIMITED', 'CLUSTER_UNAVAILABLE',
  'SHUTTING_DOWN', 'CONNECTION_LOST', 'CONNECT_FAILED', 'PAYLOAD_TOO_LARGE',
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
  'CONNECT_FAILED']))

export const NoProviderError = kind('NoProviderError', 'NO_PROVIDER')
export const ResponseTimeoutError = kind('ResponseTimeoutError', 'RESPONSE_TIMEOUT')
export const ProviderError = kind('ProviderError', 'PROVIDER_ERROR')
export const ProviderGoneError = kind('ProviderGoneError', 'PROVIDER_GONE')
export const InvalidMessageError = kind('InvalidMessageError', 'INVALID_MESSAGE')
export const NotAuthenticatedError = kind('NotAuthenticatedError', 'NOT_AUTHENTICATED')
export const PermissionDeniedError = kind('PermissionDeniedError', 'PERMISSION_DENIED')
export const RateLimitedError = kind('RateLimitedError', 'RATE_LIMITED')
export const ClusterUnavailableError = kind('ClusterUnavailableError', 'CLUSTER_UNAVAILABLE')
export const ShuttingDownError = kind('ShuttingDownError', 'SHUTTING_DOWN')
export const ConnectionLostError = kind('ConnectionLostError', 'CONNECTION_LOST')
export const ConnectFailedError = kind('ConnectFailedError', 'CONNECT_FAILED')
export const PayloadTooLargeError = kind('PayloadTooLargeError', 'PAYLOAD_TOO_LARGE')
export const LimitExceededError = kind('LimitExceededError', 'LIMIT_EXCEEDED')
export const BusyError = kind('BusyError', 'BUSY')

/** The most specific error for a wire code; an unknown code gives a plain RpcError. */
export function errorFromCode (code, message = '') {
  const cls = byCode.get(code)
  return cls ? new cls(message) : new RpcError(String(code), message)
}

/** Thrown by a provider's handler to hand the call to another provider (REJECT). */
export class Reject extends Error {
  constructor (message = 'rejected') {
    super(message)
    this.name = 'Reject'
  }
}
