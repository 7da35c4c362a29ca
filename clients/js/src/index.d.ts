// Types of the rpcbus JavaScript SDK (src/index.js).

export type State = 'connecting' | 'connected' | 'reconnecting' | 'closed'

export interface Logger {
  info(message: string): void
  warn(message: string): void
}

export interface ConnectOptions {
  /** A label for this client (providers see it in ctx.caller). */
  name?: string
  user?: string
  password?: string
  /** A token, or a function returning one (called for each login, and before a JWT
   * expires: the new one renews the session's rights without reconnecting). */
  token?: string | (() => string | Promise<string>)
  /** ms to open a connection and authenticate (default 10000). */
  openTimeout?: number
  /** ms the client waits past a call's timeout before failing it itself (default 1000). */
  grace?: number
  /** Connect again (to the next URL) when the connection is lost (default true). */
  reconnect?: boolean
  backoff?: Backoff
  onState?: (state: State) => void
  /** Where the SDK's few log lines go; silent by default. `console` will do. */
  logger?: Logger
  /** A WebSocket class to use instead of the platform's (or the `ws` package's). */
  WebSocket?: unknown
  /** Node.js with the `ws` package only: its client options (`ca` for wss://, ...). */
  wsOptions?: Record<string, unknown>
  /** Largest frame taken from a node, in bytes (the `ws` package only; default 16 MiB). */
  maxSize?: number
}

export interface CallOptions {
  /** ms for the whole call (default: the node's response timeout, 10 s). */
  timeout?: number
  /** Aborting gives the call up; the node cancels the provider's handler. */
  signal?: AbortSignal
  /** Send it again on a new connection if the one it went out on is lost. */
  idempotent?: boolean
  /** W3C trace context; reaches the provider as ctx.traceparent. */
  traceparent?: string
}

export interface CallContext {
  rpc: string
  /** The node's id for this attempt. */
  callId: number
  /** The caller's label@session: chosen by the caller, not proof of who it is. */
  caller: string
  /** ms the caller still waited when the request arrived. */
  timeLeft: number
  traceparent: string | null
  /** The caller's authenticated user, set by the node (null with auth mode none). */
  user: string | null
  /** Aborted when the node cancels the call (the caller gave up, or its deadline passed). */
  signal: AbortSignal
}

/** A handler answers with a value (or a promise of one), or in parts: an async iterable or
 * a generator (`async function*`, `function*`) serves `stream()` calls. */
export type Handler<T = any, R = any> = (data: T, ctx: CallContext) =>
  R | Promise<R> | AsyncIterable<R> | Generator<R, unknown, undefined>

export interface StreamOptions {
  /** ms for the whole stream (default: the node's response timeout, 10 s). */
  timeout?: number
  /** Aborting gives the stream up; the node cancels the provider's iterator. */
  signal?: AbortSignal
  /** Parts the provider may send ahead of the reading, 1-1024 (default 64). */
  window?: number
  /** W3C trace context, passed to the provider's handler as ctx.traceparent. */
  traceparent?: string
}

export interface CallAllOptions {
  /** ms until the replies are in (default: the node's response timeout, 10 s). */
  timeout?: number
  /** Aborting gives it up; every provider's handler still running is cancelled. */
  signal?: AbortSignal
  /** Stop after this many replies (the rest are cancelled). */
  maxReplies?: number
  /** W3C trace context, passed to each provider's handler as ctx.traceparent. */
  traceparent?: string
}

/** One provider of a name (discovery), with its node's figures of it for that name alone;
 * a node that says only how many: provider null. */
export interface ProviderInfo {
  provider: string | null
  node: string
  weight?: number
  /** calls ended over about the last minute, per second */
  calls_per_s?: number
  /** a timed attempt's time, peak EWMA */
  ms?: number
  /** attempts under way now */
  outstanding?: number
  /** over about the last minute; p50/p99 null: no attempt timed */
  calls?: number | null
  errors?: number | null
  p50_ms?: number | null
  p99_ms?: number | null
  count?: number
}

/** One provider's reply to callAll: its label (docs/protocol.md, "Labels") and node, and
 * its value (`ok` true) or error (`ok` false), as Python's `rpcbus.Reply`. */
export type Reply<R = any> =
  | { provider: string, node: string, ok: true, value: R, error?: undefined }
  | { provider: string, node: string, ok: false, value?: undefined, error: RpcError }

/** A name the cluster provides that the user may call (Python's `rpcbus.RpcInfo`). */
export interface RpcInfo {
  rpc: string
  providers: number
  nodes: Record<string, number>
}

/** The parts of one stream, in order; leaving `for await` early cancels the provider. */
export declare class Stream<R = any> implements AsyncIterableIterator<R> {
  [Symbol.asyncIterator](): Stream<R>
  next(): Promise<IteratorResult<R, undefined>>
  return(): Promise<IteratorResult<R, undefined>>
}

export declare class Client {
  readonly urls: string[]
  readonly url: string
  state: State
  closed: boolean
  /** The current node's AUTH_OK fields (node, session, user, max_frame, ...). */
  session: Record<string, unknown>
  staleRequests: number
  /** Messages from the node that could not be decoded and were dropped (each logged). */
  messagesDropped: number
  constructor(urls: string | string[], options?: ConnectOptions)
  call<R = any>(name: string, data?: unknown, options?: CallOptions): Promise<R>
  /** What the cluster provides that this user may call, by name. */
  rpcs(): Promise<RpcInfo[]>
  /** The providers of `name` across the cluster, with their last minute's figures. */
  providers(name: string): Promise<ProviderInfo[]>
  /** Call `name` on every provider of it: one reply per provider. */
  callAll<R = any>(name: string, data?: unknown, options?: CallAllOptions): Promise<Array<Reply<R>>>
  /** Call `name` as a stream: `for await (const part of client.stream(name, data))`. */
  stream<R = any>(name: string, data?: unknown, options?: StreamOptions): Stream<R>
  provide<T = any, R = any>(name: string, handler: Handler<T, R>): Promise<void>
  unprovide(name: string): Promise<void>
  /** Events lost for this client that its nodes counted (it read too slowly). */
  eventsLost: number
  /** Events dropped as had already: a node this client moved to gave again what the node
   * it left had handed it (docs/events.md, "At most once"). */
  readonly eventsRepeated: number
  /** Every event emitted to `topic` from now on, on any node, to `handler(data)`;
   * resolves once the cluster hears the topic for this client (docs/events.md). */
  subscribe<T = any>(topic: string, handler: (data: T) => void | Promise<void>,
    options?: { onGap?: (topic: string, count: number | null) => void }): Promise<void>
  /** Stop handing `topic`'s events to `handler` (to every handler: none given). */
  unsubscribe(topic: string, handler?: (data: any) => void | Promise<void>): Promise<void>
  /** An event to every subscriber of `topic` on any node: at most once, no answer. */
  emit(topic: string, data?: unknown): Promise<void>
  /** Every user online that this user may see, or for each of `users` whether it is. */
  presence(): Promise<string[]>
  presence(users: string[]): Promise<Record<string, boolean>>
  /** `handler(user, online)` on each login or logout across the cluster (of `users`). */
  watchPresence(handler: (user: string, online: boolean) => void, users?: string[] | null): Promise<void>
  /** Stop every handler (no users given), or watching `users`. */
  unwatchPresence(users?: string[] | null): Promise<void>
  ping(): Promise<void>
  /** Withdraw every name, let running handlers finish (up to `timeout` ms), then close. */
  drain(timeout?: number): Promise<void>
  close(): Promise<void>
}

export declare function connect(urls: string | string[], options?: ConnectOptions): Promise<Client>

export declare class Backoff {
  constructor(minimum?: number, maximum?: number, rand?: () => number)
  next(): number
  reset(): void
}

export declare const CODES: readonly string[]

export declare class RpcError extends Error {
  constructor(code: string, message?: string)
  /** Stable: what went wrong (docs/protocol.md lists the codes). */
  readonly code: string
  /** For people: the node's text, without the code (the code when there is none). */
  readonly message: string
  /** @deprecated The same text as `message`; before 0.2, `message` began with the code. */
  readonly detail: string
  /** "CODE: text", as the Python SDK's str(err). */
  toString(): string
}
declare class CodedError extends RpcError { constructor(message?: string) }
export declare class NoProviderError extends CodedError {}
export declare class ResponseTimeoutError extends CodedError {}
/** A provider that may run a call before it accepts it (a deepstream client) did not accept it in time: it may have run. */
export declare class AcceptTimeoutError extends ResponseTimeoutError {}
export declare class ProviderError extends CodedError {}
export declare class ProviderGoneError extends CodedError {}
export declare class InvalidMessageError extends CodedError {}
export declare class NotAuthenticatedError extends CodedError {}
export declare class PermissionDeniedError extends CodedError {}
export declare class RateLimitedError extends CodedError {}
export declare class ClusterUnavailableError extends CodedError {}
export declare class ShuttingDownError extends CodedError {}
/** Every provider was busy: shed, or no slot in time. Not run; safe to retry after `retryAfter` ms. */
export declare class OverloadedError extends CodedError { retryAfter: number }
export declare class ConnectionLostError extends CodedError {}
export declare class ConnectFailedError extends CodedError {}
export declare class PayloadTooLargeError extends CodedError {}
export declare class LimitExceededError extends CodedError {}
export declare class BusyError extends CodedError {}
/**
 * An application's error: throw it in a handler; the caller gets an AppError with the same
 * code, message and data. The code is the application's (1-128 characters, not one of
 * rpcbus's CODES: RangeError otherwise).
 */
export declare class AppError extends RpcError {
  constructor(code: string, message?: string, data?: unknown)
  readonly data: unknown
}
export declare const APP_ERROR: 'APP_ERROR'
export declare const MAX_APP_CODE: number
export declare function errorFromCode(code: string, message?: string, detail?: unknown): RpcError

/** Throw it from a handler to hand the call to another provider. */
export declare class Reject extends Error {
  constructor(message?: string)
}
