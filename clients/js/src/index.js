// rpcbus for browsers and Node.js: connect to a node, provide RPCs, call them.
// docs/protocol.md is the contract; clients/js/README.md shows the use.

export { Client, connect } from './client.js'
export { Backoff } from './backoff.js'
export * from './errors.js'
