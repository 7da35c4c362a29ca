// The rpcbus client for browsers and Node.js: the same semantics as the Python SDK
// (clients/client.py), point by point; docs/protocol.md is the contract.
//
// One WebSocket at a time carries new calls. Every call has one record in one map, removed
// the moment it ends, whatever ends it; the node enforces every deadline and the client
// keeps a safety deadline of its own (timeout + grace), swept by one interval timer.
//
// Losing the connection: calls sent on it fail with CONNECTION_LOST, except idempotent ones,
// which are sent again on the next connection (answered there with a code that says "did
// not run", one fails CONNECTION_LOST instead: it may have run on the lost one). Unless `reconnect: false`, the client
// connects again (backoff with jitter) to the next URL, provides again every name, and
// sends the calls made meanwhile (they never left, so they cannot have run) with the time
// their callers have left. A node shutting down says so: the client moves to another URL
// at once; calls and handlers under way there finish there, and a call it refused with
// SHUTTING_DOWN never ran, so it is sent again on the next connection.
//
// Providing: a handler gets (data, ctx). Every call's ACCEPT is written to the socket before
// any of its handler's code runs, and a REQUEST taken after half the node's ack timeout is
// refused unrun, judged per REQUEST: so however long a handler holds the event loop, the
// node never moves a call that started here, and never runs one twice (the Python SDK's
// rule). A value is answered at once, a promise when it settles. `throw new Reject()` hands the call
// to another provider; any other throw answers PROVIDER_ERROR with its message. A CANCEL
// from the node (the caller gave up, or the deadline passed) aborts `ctx.signal` and drops
// the answer.

import { Backoff } from './backoff.js'
import { fetchToken, renewIn, RETRY_MS } from './credentials.js'
import { Deadlines } from './deadlines.js'
import { Seen } from './seen.js'
import { Held } from './staleness.js'
import * as errors from './errors.js'
import * as p from './protocol.js'
import { webSocketClass } from './socket.js'
import { DEFAULT_WINDOW, Inflow, isParts, MAX_WINDOW, serveParts, Stream } from './streams.js'
import { Wire } from './wire.js'

const now = () => globalThis.performance.now()
const SWEEP_MS = 50
const silent = { info () {}, warn () {} }

class NotRun extends Error {} // a node refused the call unrun (it is shutting down)

function isThenable (value) {
  return value !== null && (typeof value === 'object' || typeof value === 'function') &&
    typeof value.then === 'function'
}

// A handler's throw as its answer: REJECT for Reject, the application's error for AppError,
// else PROVIDER_ERROR "Type: text" (the logger, when the application gave one, gets the stack)
function failure (id, err, log, name) {
  if (err instanceof errors.Reject) return [p.REJECT, id]
  if (err instanceof errors.AppError) {
    return [p.ERROR, id, errors.APP_ERROR, String(err.message === err.code ? '' : err.message).slice(0, MAX_ERROR_MESSAGE),
      [err.code, err.data === undefined ? null : err.data]]
  }
  log.warn(`handler_failed rpc=${name} call_id=${id}: ${err instanceof Error ? (err.stack || err) : String(err)}`)
  const kind = err instanceof Error ? err.name : typeof err
  const text = err instanceof Error ? err.message : String(err)
  return [p.ERROR, id, 'PROVIDER_ERROR', (text ? `${kind}: ${text}` : kind).slice(0, MAX_ERROR_MESSAGE)]
}

const MAX_ERROR_MESSAGE = 4096

export class Client {
  constructor (urls, options = {}) {
    this.urls = typeof urls === 'string' ? [urls] : [...(urls || [])]
    if (this.urls.length === 0) throw new TypeError('connect needs at least one URL')
    for (const url of this.urls) {
      if (typeof url !== 'string' || !/^wss?:\/\//.test(url)) {
        throw new TypeError(`not a WebSocket URL (ws:// or wss://): ${url}`)
      }
    }
    const o = options
    this.name = o.name ?? null
    this.credentials = {}
    for (const key of ['user', 'password']) if (o[key]) this.credentials[key] = o[key]
    if (o.token != null && typeof o.token !== 'string' && typeof o.token !== 'function') {
      throw new TypeError('token must be a string or a function returning one')
    }
    this._tokenSource = o.token || null // a string, or a function returning one (renewed)
    this._token = null // the last token fetched
    this._renewal = null // the timer of the next token renewal
    this._renewing = false
    this.openTimeout = o.openTimeout ?? 10000
    this.grace = o.grace ?? 1000
    this.reconnect = o.reconnect ?? true
    this.backoff = o.backoff ?? new Backoff(50, 5000)
    this.onState = o.onState ?? null
    this.log = o.logger ?? silent // silent unless the application gives one (console, ...)
    this.wsOptions = o.wsOptions ?? {} // Node.js `ws` only: { ca }, headers, ...
    this.maxSize = o.maxSize ?? 16 << 20 // largest frame taken from a node (`ws` only)
    this.WebSocket = o.WebSocket ?? null
    this.state = 'connecting'
    this.session = {} // the current node's AUTH_OK fields
    this.closed = false
    this.staleRequests = 0 // REQUESTs refused unrun: read too late
    this.messagesDropped = 0 // from the node, undecodable (logged)
    this._nextUrl = 0
    this._wire = null // the connection new calls go to
    this._lastUrl = null // the URL of the last connection used (for logs)
    this._waiting = [] // resolvers of those waiting for a connection
    this._ids = 1
    this._pending = new Map() // ref -> {resolve, reject, wire, msg?, until?, idempotent?}
    this._queued = [] // call refs waiting for a connection
    this._handlers = new Map() // name -> handler
    this._topics = new Map() // event topic -> [[handler, onGap], ...] in the order added
    this._watchers = [] // presence: [handler, Set of users or null (everyone)]
    this.eventsLost = 0 // events the nodes said they dropped for this client (read too slowly)
    this._seen = new Seen() // the newest event number had, by topic and origin
    this._starting = [] // [wire, id, handler, data, ctx] ACCEPTed in the frame being read
    this._draining = new Set() // wires of nodes shutting down (or cut off), until they close
    this._moving = false // moving off a node cut off from the cluster
    this._defaultTimeout = 10000
    this._maxTimeout = 0
    this._deadlines = new Deadlines(SWEEP_MS, now())
    this._sweeper = null
    this._reconnecting = false
    this._reconnectTimer = null
    this._lastError = ''
    this._lastErr = null
  }

  /** The URL of the current (or last) connection. */
  /** Events dropped as had already (this client moved to another node, which gave again
   * what the first one had: seen.js). */
  get eventsRepeated () { return this._seen.repeats }

  get url () { return this._wire ? this._wire.url : this.urls[(this._nextUrl + this.urls.length - 1) % this.urls.length] }

  // -- life ------------------------------------------------------------------------------

  async _open () {
    // Nodes still starting (joining the cluster) answer HTTP 503 ("starting"), nodes with
    // too many connections 503 or 429: wait for them within openTimeout, trying every URL
    // again. Node.js (ws) tells the status but not the body (so a draining node's 503 is
    // waited out too); browsers tell neither, so there such a node fails connect as a
    // refused one does.
    const giveUp = now() + this.openTimeout
    let wire = await this._connectAny(null)
    while (wire === null && this._startingSeen && !this.closed) {
      const delay = this.backoff.next() // reset once connected (_use)
      if (now() + delay >= giveUp) break
      await new Promise((resolve) => setTimeout(resolve, delay))
      wire = await this._connectAny(null)
    }
    if (wire === null) {
      this.closed = true
      this._setState('closed')
      if (this._lastErr instanceof errors.RpcError) throw this._lastErr // refused credentials
      throw new errors.ConnectFailedError(`cannot connect to ${this._lastError}`)
    }
    this._held = new Held(SWEEP_MS, now())
    this._sweeper = setInterval(() => this._sweep(), SWEEP_MS)
    this._use(wire)
    return this
  }

  /** One pass over the URLs (`avoid` last, or not at all with `skip`): the first
   * authenticated wire, or null. */
  async _connectAny (avoid, skip = false) {
    const n = this.urls.length
    const order = Array.from({ length: n }, (_, i) => this.urls[(this._nextUrl + i) % n])
    if (avoid !== null && n > 1 && order.includes(avoid)) {
      order.splice(order.indexOf(avoid), 1)
      if (!skip) order.push(avoid)
    }
    this._lastError = 'no URL tried'
    this._lastErr = null
    this._startingSeen = false
    for (const url of order) {
      if (this.closed) return null
      this._nextUrl = (this.urls.indexOf(url) + 1) % n
      try {
        return await this._handshake(url)
      } catch (err) {
        this._lastError = `${url}: ${err && err.message}`
        this._lastErr = err
        if (/server response: (429|503)/.test(this._lastError)) this._startingSeen = true
      }
    }
    return null
  }

  async _handshake (url) {
    const { WebSocket: WS, node } = await webSocketClass(this.WebSocket)
    const ws = node
      ? new WS(url, { perMessageDeflate: false, maxPayload: this.maxSize, ...this.wsOptions })
      : new WS(url)
    ws.binaryType = node ? 'nodebuffer' : 'arraybuffer'
    const wire = new Wire(this, url, ws)
    let fail
    const failed = new Promise((resolve, reject) => { fail = reject })
    failed.catch(() => {})
    const timer = setTimeout(() => fail(new Error(`no answer within ${this.openTimeout} ms`)), this.openTimeout)
    let why = '' // what the error before the close said (`ws` tells; browsers do not)
    ws.onerror = (ev) => { why = (ev && (ev.message || (ev.error && ev.error.message))) || why }
    ws.onclose = (ev) => {
      if (wire.closeWaiter) wire.closeWaiter()
      fail(new Error(`connection closed (${ev.code}${ev.reason ? ' ' + ev.reason : ''})${why ? ': ' + why : ''}`))
      this._onLost(wire, ev)
    }
    ws.onmessage = (ev) => this._onFrame(wire, ev.data)
    try {
      await Promise.race([new Promise((resolve) => { ws.onopen = resolve }), failed])
      // event_origins: it takes EVENTs with their origin and number (seen.js)
      const params = { protocol: p.PROTOCOL_VERSION, ...this.credentials, event_origins: true }
      if (this._tokenSource !== null) {
        try {
          params.token = this._token = await fetchToken(this._tokenSource)
        } catch (err) {
          throw new errors.NotAuthenticatedError(`the token function failed: ${err}`)
        }
      }
      if (this.name) params.name = this.name
      const busy = new Backoff(50, 1000)
      for (;;) { // AUTH_FAIL BUSY: the node could not check it now; again, later
        const auth = new Promise((resolve, reject) => { wire.auth = { resolve, reject } })
        wire.send([p.AUTH, params])
        try {
          wire.session = await Promise.race([auth, failed])
          wire.stamps = wire.session.sent === true
          break
        } catch (err) {
          if (!(err instanceof errors.BusyError)) throw err
          await Promise.race([new Promise((resolve) => setTimeout(resolve, busy.next())), failed])
        }
      }
    } catch (err) {
      wire.lost = true // its loss is not ours
      wire.close()
      throw err
    } finally {
      clearTimeout(timer)
    }
    const s = wire.session
    wire.staleness.staleAfterMs = (s.ack_timeout_ms ?? 1000) / 2
    if (Number.isInteger(s.max_frame) && s.max_frame > 0) wire.maxFrame = s.max_frame
    if (Number.isInteger(s.max_frame_messages) && s.max_frame_messages > 0) wire.maxMessages = s.max_frame_messages
    this._renewLater()
    return wire
  }

  // -- token renewal (src/credentials.js) -------------------------------------------------

  /** Renew the token after `delayMs` (undefined: when the current one says, but not before
   * `leastMs`: a token function that hands out a token near its expiry again is asked again
   * only every RETRY_MS). */
  _renewLater (delayMs, leastMs = 0) {
    if (typeof this._tokenSource !== 'function' || this.closed) return
    let delay = delayMs ?? renewIn(this._token, Date.now())
    if (delay === null) return
    if (delayMs === undefined) delay = Math.max(delay, leastMs)
    clearTimeout(this._renewal)
    this._renewal = setTimeout(() => { this._renewal = null; this._renew() }, delay)
    if (typeof this._renewal === 'object' && this._renewal.unref) this._renewal.unref()
  }

  /** A new token from the token function, sent as AUTH on every open connection; names
   * withdrawn when the old one expired are provided again. A failure is logged and tried
   * again after RETRY_MS. */
  async _renew () {
    if (this._renewing || this.closed) return
    this._renewing = true
    try {
      const token = this._token = await fetchToken(this._tokenSource)
      for (const wire of this._wires()) {
        if (!wire.open) continue
        const auth = new Promise((resolve, reject) => { wire.auth = { resolve, reject } })
        wire.send([p.AUTH, { token }])
        let timer
        await Promise.race([auth, new Promise((resolve, reject) => {
          timer = setTimeout(() => reject(new Error('no answer to AUTH')), this.openTimeout)
        })]).finally(() => clearTimeout(timer))
        if (wire.expired) {
          wire.expired = false
          if (this._handlers.size) wire.send([p.PROVIDE, this._ids++, [...this._handlers.keys()]])
    const topics = [...this._topics.keys()] // subscribe again (what came between: told at the loss)
    for (let i = 0; i < topics.length; i += 100) wire.send([p.SUBSCRIBE, this._ids++, topics.slice(i, i + 100)])
    if (this._watchers.some(([, of]) => of === null)) wire.send([p.PRESENCE_SUBSCRIBE, this._ids++, null])
    const named = [...new Set(this._watchers.flatMap(([, of]) => of === null ? [] : [...of]))]
    for (let i = 0; i < named.length; i += 100) wire.send([p.PRESENCE_SUBSCRIBE, this._ids++, named.slice(i, i + 100)])
        }
      }
    } catch (err) {
      this.log.warn(`token_renewal_failed url=${this._lastUrl} error=${err} (again in ${RETRY_MS / 1000} s)`)
      this._renewing = false
      this._renewLater(RETRY_MS)
      return
    }
    this._renewing = false
    this._renewLater(undefined, RETRY_MS)
  }

  /** Make `wire` the connection for new calls; send what waited for one. */
  _use (wire) {
    this._lastUrl = wire.url
    this._wire = wire
    this.session = wire.session
    this._defaultTimeout = this.session.response_timeout_ms ?? 10000
    this._maxTimeout = this.session.max_timeout_ms ?? 0 // the longest the node takes; 0: not told
    if (this._handlers.size) wire.send([p.PROVIDE, this._ids++, [...this._handlers.keys()]])
    const topics = [...this._topics.keys()] // subscribe again (what came between: told at the loss)
    for (let i = 0; i < topics.length; i += 100) wire.send([p.SUBSCRIBE, this._ids++, topics.slice(i, i + 100)])
    if (this._watchers.some(([, of]) => of === null)) wire.send([p.PRESENCE_SUBSCRIBE, this._ids++, null])
    const named = [...new Set(this._watchers.flatMap(([, of]) => of === null ? [] : [...of]))]
    for (let i = 0; i < named.length; i += 100) wire.send([p.PRESENCE_SUBSCRIBE, this._ids++, named.slice(i, i + 100)])
    this._sendQueued(wire)
    const waiting = this._waiting.splice(0)
    for (const resolve of waiting) resolve()
    this.backoff.reset()
    this._setState('connected')
  }

  /** Send on `wire` the calls that waited for a connection, each with the time its caller
   * has left (one whose time is up stays for the sweeper to fail). */
  _sendQueued (wire) {
    const queued = this._queued.splice(0)
    const t = now()
    for (const ref of queued) {
      const call = this._pending.get(ref)
      if (call === undefined || call.wire !== null) continue
      const left = call.until - t
      if (left <= 0) { this._queued.push(ref); continue }
      call.wire = wire
      const sent = call.msg.slice() // built anew, with the time its caller has left
      sent[4] = Math.max(1, Math.floor(left))
      wire.sendCall(sent)
    }
  }

  _setState (state) {
    if (state === this.state) return
    this.state = state
    // the node it is (or was last) connected to; never connected: the URLs it tries
    const url = this._wire ? this._wire.url : (this._lastUrl ?? this.urls.join(','))
    this.log.info(`client_${state} url=${url}`)
    if (this.onState) {
      try { this.onState(state) } catch (err) { this.log.warn(`onState failed: ${err}`) }
    }
  }

  /** Close the connection(s); pending calls fail with CONNECTION_LOST and the node is told to
   * CANCEL them. Handlers still running (their node had their ACCEPT before they started)
   * are aborted: their callers get PROVIDER_GONE, never a second run. Idempotent. */
  async close () {
    if (this.closed) return
    this.closed = true
    clearTimeout(this._renewal)
    for (const [ref, entry] of this._pending) { // nobody waits for these answers now
      if (entry.msg !== undefined && entry.wire !== null && entry.wire.open) entry.wire.send([p.CANCEL, ref])
    }
    const closing = []
    for (const wire of this._wires()) {
      wire.flush()
      if (wire.open) {
        closing.push(new Promise((resolve) => {
          const timer = setTimeout(resolve, 1000) // the close handshake, bounded
          wire.closeWaiter = () => { clearTimeout(timer); resolve() }
        }))
      }
      wire.close()
    }
    this._failAll(new errors.ConnectionLostError('the client was closed'))
    this._setState('closed')
    await Promise.all(closing)
  }

  /** Stop taking calls: withdraw every name, let the handlers running finish (those still
   * running after `timeout` ms are aborted as by close()), then close. */
  async drain (timeout) {
    if (this.closed) return
    const names = [...this._handlers.keys()]
    this._handlers.clear() // from now on every REQUEST is refused unrun
    if (names.length && this._wire !== null) {
      try { await this._control(p.UNPROVIDE, names) } catch (err) {
        if (!(err instanceof errors.RpcError)) throw err // gone: nothing is routed here any more
      }
    }
    const running = []
    for (const wire of this._wires()) {
      for (const entry of wire.running.values()) running.push(entry.done)
    }
    if (running.length) {
      const all = Promise.all(running)
      if (timeout === undefined) await all
      else await Promise.race([all, new Promise((resolve) => setTimeout(resolve, timeout))])
    }
    await this.close()
  }

  _wires () {
    const wires = new Set(this._wire ? [this._wire] : [])
    for (const entry of this._pending.values()) if (entry.wire) wires.add(entry.wire)
    for (const wire of this._draining) wires.add(wire)
    return wires
  }

  // -- calling ---------------------------------------------------------------------------

  /**
   * Call `name` with `data`: the provider's answer, or a rejection with an RpcError.
   * `timeout` (ms) bounds the whole call (default: the node's response timeout; one over the
   * node's longest, rpc.max_timeout, rejects with a RangeError before it is sent); `signal`
   * (AbortSignal) gives the call up and tells the node, which cancels the provider's
   * handler; `idempotent` lets the client send it again on a new connection if the one it
   * went out on is lost; `traceparent` reaches the provider's handler as ctx.traceparent.
   */
  call (name, data = null, options = {}) {
    const { timeout, signal, idempotent = false, traceparent } = options
    const problem = this._problem(timeout, signal)
    if (problem !== null) return Promise.reject(problem)
    const ref = this._ids++
    const timeoutMs = timeout == null ? null : Math.max(1, Math.floor(timeout))
    const msg = [p.REQUEST, ref, name, data, timeoutMs]
    if (traceparent) msg.push({ traceparent })
    const until = now() + (timeoutMs ?? this._defaultTimeout)
    return new Promise((resolve, reject) => {
      this._send(ref, { resolve, reject, wire: null, msg, until, idempotent, signal, onAbort: null })
    })
  }

  /** Why a call with this `timeout` and `signal` cannot go out (an error to throw), or null. */
  _problem (timeout, signal) {
    if (this.closed) return new errors.ConnectionLostError('the client is closed')
    if (timeout !== undefined && timeout !== null && !(timeout > 0)) {
      return new RangeError('timeout must be a positive number of milliseconds')
    }
    if (this._maxTimeout > 0 && timeout > this._maxTimeout) {
      return new RangeError(`timeout ${timeout} ms is over the node's longest, ` +
        `${this._maxTimeout} ms (rpc.max_timeout): shorten it, or raise rpc.max_timeout on the nodes`)
    }
    if (signal && signal.aborted) return signal.reason
    return null
  }

  /**
   * Call `name` on every provider of it across the cluster: resolves with one reply per
   * provider, `{ provider, node, ok: true, value }` or `{ provider, node, ok: false, error }` (an RpcError), in the
   * order they came, when every provider answered, `maxReplies` did, or `timeout` (ms)
   * passed (a provider still working then gets a ResponseTimeoutError). Each provider runs
   * it at most once; `signal` gives it up (every handler still running is cancelled).
   */
  callAll (name, data = null, options = {}) {
    const { timeout, signal, maxReplies, traceparent } = options
    const problem = this._problem(timeout, signal)
    if (problem !== null) return Promise.reject(problem)
    if (maxReplies !== undefined && !(Number.isInteger(maxReplies) && maxReplies > 0)) {
      return Promise.reject(new RangeError('maxReplies must be a positive integer'))
    }
    const ref = this._ids++
    const timeoutMs = timeout == null ? null : Math.max(1, Math.floor(timeout))
    const msg = [p.ALL, ref, name, data, timeoutMs]
    const meta = {}
    if (maxReplies !== undefined) meta.max_replies = maxReplies
    if (traceparent) meta.traceparent = traceparent
    if (Object.keys(meta).length) msg.push(meta)
    const until = now() + (timeoutMs ?? this._defaultTimeout)
    return new Promise((resolve, reject) => {
      const replies = []
      this._send(ref, { resolve: () => resolve(replies), reject, wire: null, msg, until, idempotent: false, signal, onAbort: null, replies })
    })
  }

  /** A call's (or stream's) record goes in the table and its message out, now or when a
   * connection comes; an abort of its `signal` gives it up (CANCEL, rejected with the
   * signal's reason). */
  _send (ref, entry) {
    const signal = entry.signal
    if (signal) {
      entry.onAbort = () => {
        if (!this._pending.has(ref)) return
        if (entry.wire !== null && entry.wire.open) entry.wire.send([p.CANCEL, ref])
        this._finish(ref, signal.reason, undefined)
      }
      signal.addEventListener('abort', entry.onAbort, { once: true })
    }
    this._pending.set(ref, entry)
    this._deadlines.add(ref, entry.until + this.grace)
    const wire = this._wire
    if (wire === null) {
      this._queued.push(ref)
    } else {
      entry.wire = wire
      wire.sendCall(entry.msg)
    }
  }

  /**
   * Call `name` as a stream: an async iterable of the provider's parts (src/streams.js).
   * `timeout` (ms) bounds the whole stream; `signal` gives it up; `window` (1-1024, default
   * 64) is how many parts the provider may send ahead of the reading. Nothing is sent until
   * the first part is asked for.
   */
  stream (name, data = null, options = {}) {
    const { timeout, signal, window = DEFAULT_WINDOW, traceparent } = options
    if (!Number.isInteger(window) || window < 1 || window > MAX_WINDOW) {
      throw new RangeError(`window must be an integer of 1-${MAX_WINDOW}`)
    }
    return new Stream(this, () => this._openStream(name, data, timeout, signal, window, traceparent))
  }

  _openStream (name, data, timeout, signal, window, traceparent) {
    const ref = this._ids++
    const entry = {
      ref, wire: null, msg: null, until: 0, idempotent: false, signal, onAbort: null,
      inflow: new Inflow(window), ended: null, wake: null,
      resolve: (value) => { entry.ended = { value }; entry.wakeUp() },
      reject: (err) => { entry.ended = { err }; entry.wakeUp() },
      wakeUp: () => { const w = entry.wake; entry.wake = null; if (w) w() }
    }
    const problem = this._problem(timeout, signal)
    if (problem !== null) {
      entry.ended = { err: problem }
      return entry
    }
    const timeoutMs = timeout == null ? null : Math.max(1, Math.floor(timeout))
    const meta = { window }
    if (traceparent) meta.traceparent = traceparent
    entry.msg = [p.STREAM, ref, name, data, timeoutMs, meta]
    entry.until = now() + (timeoutMs ?? this._defaultTimeout)
    this._send(ref, entry)
    return entry
  }

  /** The application stopped reading an unfinished stream: CANCEL to its node. */
  _abandonStream (entry) {
    if (!this._pending.has(entry.ref)) return
    if (entry.wire !== null && entry.wire.open) entry.wire.send([p.CANCEL, entry.ref])
    this._finish(entry.ref, undefined, undefined)
  }

  /** End call or control `ref`: resolve with `value`, or reject with `err` when given. */
  _finish (ref, err, value) {
    const entry = this._pending.get(ref)
    if (entry === undefined) return // ended already: a late answer
    this._pending.delete(ref)
    if (entry.onAbort) entry.signal.removeEventListener('abort', entry.onAbort)
    if (err !== undefined) entry.reject(err)
    else entry.resolve(value)
  }

  // -- providing -------------------------------------------------------------------------

  /** Serve `name` with `handler(data, ctx)` until unprovide() or close, across reconnects. */
  async provide (name, handler) {
    if (!p.validName(name)) throw new TypeError(`invalid rpc name ${JSON.stringify(name)}`)
    if (typeof handler !== 'function') throw new TypeError('handler must be a function')
    this._handlers.set(name, handler)
    try {
      await this._control(p.PROVIDE, [name])
    } catch (err) {
      this._handlers.delete(name)
      throw err
    }
  }

  /** Stop serving `name`; calls already running finish. */
  async unprovide (name) {
    this._handlers.delete(name)
    await this._control(p.UNPROVIDE, [name])
  }

  // -- events (docs/events.md) -----------------------------------------------------------

  /** Hand every event emitted to `topic` from now on, by any client on any node, to
   * `handler(data)` (across reconnects, until unsubscribe()); resolves once the cluster
   * hears the topic for this client. `options.onGap(topic, count)` is told of events lost:
   * `count` the node dropped while this client read too slowly, or null (its node lost the
   * cluster bus, or this client its connection). A handler's exception (or rejection) is
   * logged, never thrown into the client. */
  async subscribe (topic, handler, options = {}) {
    if (!p.validName(topic)) throw new TypeError(`invalid topic ${JSON.stringify(topic)}`)
    if (typeof handler !== 'function') throw new TypeError('handler must be a function')
    const entries = this._topics.get(topic)
    if (entries !== undefined) {
      entries.push([handler, options.onGap ?? null])
      return
    }
    this._topics.set(topic, [[handler, options.onGap ?? null]])
    try {
      await this._control(p.SUBSCRIBE, [topic])
    } catch (err) {
      this._topics.delete(topic)
      throw err
    }
  }

  /** Stop handing `topic`'s events to `handler` (to any of its handlers: none given); the
   * node stops sending them once no handler is left. */
  async unsubscribe (topic, handler) {
    const entries = this._topics.get(topic)
    if (entries === undefined) return
    const left = handler === undefined ? [] : entries.filter(([h]) => h !== handler)
    if (left.length) {
      this._topics.set(topic, left)
      return
    }
    this._topics.delete(topic)
    this._seen.forget(topic)
    if (this._wire !== null) await this._control(p.UNSUBSCRIBE, [topic])
  }

  /** Send an event to every subscriber of `topic` on any node: at most once, in order with
   * this client's other events of `topic`, no answer. Waits for a connection (up to
   * openTimeout). A refused emit is logged (`node_error`), data over the node's frame limit
   * dropped and logged (`event_too_large`). */
  async emit (topic, data = null) {
    if (!p.validName(topic)) throw new TypeError(`invalid topic ${JSON.stringify(topic)}`)
    if (this.closed) throw new errors.ConnectionLostError('the client is closed')
    if (this._wire === null) await this._connected()
    const wire = this._wire
    if (wire === null || this.closed) throw new errors.ConnectionLostError('the connection was lost')
    wire.send([p.EMIT, topic, data])
  }

  _deliver (topic, data) {
    for (const [handler] of this._topics.get(topic) ?? []) {
      try {
        const result = handler(data)
        if (isThenable(result)) result.then(undefined, (err) => this.log.warn(`event_handler_failed topic=${topic} error=${err}`))
      } catch (err) {
        this.log.warn(`event_handler_failed topic=${topic} error=${err}`)
      }
    }
  }

  _gap (topic, count) {
    if (Number.isInteger(count)) this.eventsLost += count
    this.log.warn(`events_lost topic=${topic ?? '*'} count=${count ?? 'unknown'}`)
    for (const each of topic == null ? [...this._topics.keys()] : [topic]) {
      for (const [, onGap] of this._topics.get(each) ?? []) {
        if (onGap === null) continue
        try { onGap(each, count ?? null) } catch (err) { this.log.warn(`on_gap_failed topic=${each} error=${err}`) }
      }
    }
  }

  /** Who is logged in across the cluster: every user online that this client's user may
   * see (a sorted array), or for each of `users` whether it is (an object). */
  async presence (users = null) {
    return await this._control(p.PRESENCE_GET, null, [users === null ? null : [...users]])
  }

  /** `handler(user, online)` whenever one of `users` (null: any user this client's user may
   * see) comes online anywhere in the cluster, or leaves it everywhere; across reconnects
   * (a change while disconnected is not told: ask presence()). */
  async watchPresence (handler, users = null) {
    if (typeof handler !== 'function') throw new TypeError('handler must be a function')
    const entry = [handler, users === null ? null : new Set(users)]
    this._watchers.push(entry)
    try {
      await this._control(p.PRESENCE_SUBSCRIBE, null, [users === null ? null : [...users]])
    } catch (err) {
      this._watchers = this._watchers.filter((e) => e !== entry)
      throw err
    }
  }

  /** Stop every handler (no users given), or watching `users` (a handler of everyone goes on). */
  async unwatchPresence (users = null) {
    const named = [...new Set(this._watchers.flatMap(([, of]) => of === null ? [] : [...of]))]
    if (users === null) {
      this._watchers = []
    } else {
      const gone = new Set(users)
      this._watchers = this._watchers.map(([h, of]) => [h, of === null ? null : new Set([...of].filter((u) => !gone.has(u)))])
        .filter(([, of]) => of === null || of.size > 0)
    }
    if (this._wire === null) return
    await this._control(p.PRESENCE_UNSUBSCRIBE, null, [users === null ? null : [...users]])
    if (users === null && named.length) await this._control(p.PRESENCE_UNSUBSCRIBE, null, [named])
  }

  /** A protocol-level round trip to the node. */
  async ping () { await this._control(p.PING, null) }

  /** What the cluster provides that this client's user may call, by name:
   * `[{ rpc, providers, nodes: { node: count } }]` (docs/protocol.md, "Discovery"). */
  async rpcs () { return await this._control(p.DISCOVER, null, [null]) }

  /** The providers of `name` across the cluster: `[{ provider, node, weight, calls_per_s, ms,
   * outstanding, calls, errors, p50_ms, p99_ms }]`, each provider's figures for this name
   * alone, the last four over about the last minute (null: no attempt timed); rejects with
   * PermissionDeniedError for a name the user may not call. */
  async providers (name) { return await this._control(p.DISCOVER, null, [name]) }

  /** Until there is a connection (at most openTimeout: ConnectionLostError). */
  _connected () {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const i = this._waiting.indexOf(go)
        if (i >= 0) this._waiting.splice(i, 1)
        reject(new errors.ConnectionLostError(`no connection within ${this.openTimeout} ms`))
      }, this.openTimeout)
      const go = () => { clearTimeout(timer); resolve() }
      this._waiting.push(go)
    })
  }

  async _control (kind, names, fields = null) {
    if (this.closed) throw new errors.ConnectionLostError('the client is closed')
    if (this._wire === null) await this._connected()
    const wire = this._wire
    if (wire === null || this.closed) throw new errors.ConnectionLostError('the connection was lost')
    const ref = this._ids++
    return new Promise((resolve, reject) => {
      this._pending.set(ref, { resolve, reject, wire })
      this._deadlines.add(ref, now() + this.openTimeout)
      wire.send(fields !== null ? [kind, ref, ...fields] : names === null ? [kind, ref] : [kind, ref, names])
    })
  }

  // -- frames in -------------------------------------------------------------------------

  _onFrame (wire, data) {
    if (typeof data === 'string') {
      this.log.warn(`text_frame_from_node url=${wire.url}`)
      return
    }
    const { msgs, bad } = p.decodeEach(data)
    if (bad) { // only those are lost; the rest of the frame is taken as usual
      this.messagesDropped += bad
      this.log.warn(`bad_messages_from_node url=${wire.url} dropped=${bad} kept=${msgs.length}`)
    }
    for (const msg of msgs) {
      try {
        this._onMessage(wire, msg)
      } catch (err) { // a malformed message from the node must not break the client
        this.log.warn(`bad_message_from_node url=${wire.url} kind=${msg[0]} error=${err}`)
      }
    }
    if (this._starting.length) {
      // The calls' ACCEPTs go to the socket first: no handler code has run yet, so however
      // long one holds the event loop, the node knows every call here started.
      const starting = this._starting.splice(0)
      if (wire.session && wire.session.accept_upto === true) { // one message for them all
        wire.send([p.ACCEPT_UPTO, starting.reduce((most, start) => start[1] > most ? start[1] : most, 0)])
      }
      wire.flush()
      for (const start of starting) this._start(...start)
    }
  }

  _onMessage (wire, msg) {
    const kind = msg[0]
    if (kind === p.RESPONSE) {
      if (msg.length !== 3) throw new Error('RESPONSE with the wrong fields')
      this._finish(msg[1], undefined, msg[2])
    } else if (kind === p.REPLY) {
      const entry = this._pending.get(msg[1])
      if (entry === undefined || entry.replies === undefined) return // ended here already
      const [, , provider, node, value, error] = msg
      entry.replies.push(Array.isArray(error) && error.length >= 2
        ? { provider, node, ok: false, error: errors.errorFromCode(String(error[0]), String(error[1]), error[2]) }
        : { provider, node, ok: true, value })
    } else if (kind === p.PART) {
      const entry = this._pending.get(msg[1])
      if (entry === undefined || entry.inflow === undefined) return // ended here already
      if (entry.inflow.arrived(msg[2])) {
        entry.wakeUp()
      } else {
        this._abandonStream(entry)
        entry.reject(new errors.InvalidMessageError('the node sent more parts than the window'))
      }
    } else if (kind === p.CREDIT) {
      const task = wire.running.get(msg[1])
      if (task !== undefined && task.window !== undefined && Number.isInteger(msg[2]) && msg[2] > task.read) {
        task.read = msg[2] // the parts its caller has read in all
        const w = task.wake
        task.wake = null
        if (w) w()
      }
    } else if (kind === p.OK) {
      this._finish(msg[1], undefined, undefined)
    } else if (kind === p.FOUND) {
      this._finish(msg[1], undefined, msg[2])
    } else if (kind === p.REQUEST || kind === p.STREAM) {
      if (msg.length < 6 || !Number.isInteger(msg[1]) || typeof msg[2] !== 'string') {
        throw new Error(`${kind === p.REQUEST ? 'REQUEST' : 'STREAM'} with the wrong fields`)
      }
      const t = now()
      const ackMs = msg.length > 10 && typeof msg[10] === 'number' ? msg[10] / 2 : 0
      if (msg.length > 6 && wire.staleness.stale(msg[6], t, this._held.lateBy(t), ackMs, msg[4])) {
        wire.send([p.REJECT, msg[1], 'LATE']) // the node has moved it on (or is about to)
        this.staleRequests += 1
        if ((this.staleRequests & (this.staleRequests - 1)) === 0) {
          this.log.info?.(`stale_requests_refused url=${wire.url} total=${this.staleRequests}`)
        }
        return
      }
      this._take(wire, msg[1], msg[2], msg[3], msg[4], msg[5], msg[7] ?? null, msg[8] ?? null,
        kind === p.STREAM ? msg[9] : 0)
    } else if (kind === p.EVENT) {
      if ((msg.length !== 3 && msg.length !== 5) || typeof msg[1] !== 'string') throw new Error('EVENT with the wrong fields')
      if (msg.length === 5 && !this._seen.fresh(msg[1], msg[3], msg[4])) return // had already
      this._deliver(msg[1], msg[2])
    } else if (kind === p.GAP) {
      this._gap(msg[1] ?? null, msg[2] ?? null)
    } else if (kind === p.PRESENCE) {
      for (const [handler, of] of [...this._watchers]) {
        if (of !== null && !of.has(msg[1])) continue
        try { handler(msg[1], msg[2]) } catch (err) { this.log.warn(`presence_handler_failed user=${msg[1]} error=${err}`) }
      }
    } else if (kind === p.ERROR) {
      const [, ref, code, message, detail] = msg
      if (msg.length < 4 || msg.length > 5 || typeof code !== 'string' || typeof message !== 'string') {
        throw new Error('ERROR with the wrong fields')
      }
      if (ref == null && code === 'CLUSTER_UNAVAILABLE') {
        this._nodeCutOff(wire) // a notice: the node cannot reach the cluster
        return
      }
      if (ref == null && code === 'NOT_AUTHENTICATED') { // its token expired
        wire.expired = true
        if (typeof this._tokenSource === 'function') {
          this._renewLater(0)
          return
        }
      }
      if (code === 'SHUTTING_DOWN') {
        this._nodeDraining(wire)
        const call = ref == null ? undefined : this._pending.get(ref)
        if (call !== undefined && call.msg !== undefined && this.reconnect && !this.closed) {
          call.wire = null // it never ran: send it again on the next connection
          this._queued.push(ref)
          if (this._wire !== null) this._sendQueued(this._wire)
          return
        }
        if (ref == null) return
      }
      if (ref == null || !this._pending.has(ref)) {
        this.log.warn(`node_error url=${wire.url} code=${code} error=${message} ref=${ref}`)
      } else {
        const call = this._pending.get(ref)
        // sent again after its connection was lost, where it may have run: a "did not
        // run" code is true of the last sending only
        this._finish(ref, call.maybeRan && errors.DID_NOT_RUN.has(code)
          ? new errors.ConnectionLostError('sent again after its connection was lost, ' +
            `where it may have run, then answered ${code}: ${message}`)
          : errors.errorFromCode(code, message, detail))
      }
    } else if (kind === p.CANCEL) {
      // taken in this frame (its REQUEST and the CANCEL came together): it never starts
      const i = this._starting.findIndex((start) => start[0] === wire && start[1] === msg[1])
      if (i >= 0) this._starting.splice(i, 1)
      const task = wire.running.get(msg[1])
      if (task !== undefined) {
        wire.running.delete(msg[1])
        task.controller.abort(new DOMException('the node cancelled this call', 'AbortError'))
      }
    } else if (kind === p.PING) {
      wire.send([p.PONG, msg.length > 1 ? msg[1] : null])
    } else if (kind === p.PONG) {
      if (msg.length > 1 && Number.isInteger(msg[1])) this._finish(msg[1], undefined, undefined)
    } else if (kind === p.AUTH_OK || kind === p.AUTH_FAIL) {
      const auth = wire.auth
      if (auth) {
        wire.auth = null
        if (kind === p.AUTH_OK && msg[1] !== null && typeof msg[1] === 'object') auth.resolve(msg[1])
        else if (kind === p.AUTH_OK) auth.reject(new Error('AUTH_OK without its fields'))
        else auth.reject(errors.errorFromCode(String(msg[1]), String(msg[2] ?? '')))
      }
    }
  }

  // -- serving ---------------------------------------------------------------------------

  /** Take a REQUEST: ACCEPT it (its handler starts once the frame is read and the ACCEPTs
   * written), or REJECT it unrun when the name is no longer provided here. */
  _take (wire, id, name, data, timeLeftMs, caller, traceparent, user, window) {
    const handler = this._handlers.get(name)
    // unprovided a moment ago, or closing; or this connection closes (one it moved off): no
    // ACCEPT could reach the node, which moves the call on, so not run
    if (handler === undefined || this.closed || !wire.open) {
      wire.send([p.REJECT, id])
      return
    }
    if (!(wire.session && wire.session.accept_upto === true)) wire.send([p.ACCEPT, id]) // an older node
    this._starting.push([wire, id, name, handler, data, { rpc: name, callId: id, caller, timeLeft: timeLeftMs, traceparent, user }, window])
  }

  /** Run an accepted call's handler; its outcome is sent when it settles. A STREAM
   * (`window` > 0) is served by `serveParts` when the handler returns parts; a plain
   * answer is its one part. */
  _start (wire, id, name, handler, data, fields, window) {
    const controller = new AbortController()
    let result
    try {
      result = handler(data, { ...fields, signal: controller.signal })
    } catch (err) {
      wire.send(failure(id, err, this.log, name))
      return
    }
    if (window === 0 && isParts(result)) {
      // parts for a plain call: the caller must read them with stream()
      const it = typeof result[Symbol.asyncIterator] === 'function' ? result[Symbol.asyncIterator]() : result
      if (typeof it.return === 'function') Promise.resolve(it.return()).catch(() => {})
      wire.send([p.ERROR, id, 'PROVIDER_ERROR', `'${name}' answers in parts: call it with stream()`])
      return
    }
    if (window > 0) {
      const task = { controller, done: null, window, sent: 0, read: 0, wake: null }
      wire.running.set(id, task)
      task.done = isParts(result)
        ? serveParts(this, wire, id, name, task, result, failure)
        : Promise.resolve(result).then(
          (value) => {
            if (wire.running.get(id) !== task) return
            wire.send([p.PART, id, value === undefined ? null : value])
            this._taskDone(wire, id, task, [p.RESPONSE, id, null])
          },
          (err) => this._taskDone(wire, id, task, failure(id, err, this.log, name)))
      return
    }
    if (!isThenable(result)) {
      wire.send([p.RESPONSE, id, result === undefined ? null : result])
      return
    }
    const task = { controller, done: null }
    wire.running.set(id, task)
    task.done = Promise.resolve(result).then(
      (value) => this._taskDone(wire, id, task, [p.RESPONSE, id, value === undefined ? null : value]),
      (err) => this._taskDone(wire, id, task, failure(id, err, this.log, name)))
  }

  _taskDone (wire, id, task, answer) {
    if (wire.running.get(id) !== task) return // cancelled by the node, or the connection is gone
    wire.running.delete(id)
    wire.send(answer)
  }

  _unencodable (msg, err) {
    if (msg[0] === p.PART) { // the stream ends here: its iterator is stopped
      this._stopStream(msg[1])
      return [p.ERROR, msg[1], 'PROVIDER_ERROR', `a part is not serializable: ${err.message}`]
    }
    if (msg[0] === p.RESPONSE) {
      return [p.ERROR, msg[1], 'PROVIDER_ERROR', `result is not serializable: ${err.message}`]
    }
    if (msg[0] === p.ERROR && msg.length > 4) { // an AppError whose data msgpack cannot carry
      return [p.ERROR, msg[1], 'PROVIDER_ERROR', `AppError ${msg[4][0]}: its data is not serializable: ${err.message}`]
    }
    if (msg[0] === p.REQUEST || msg[0] === p.STREAM || msg[0] === p.ALL) {
      this._finish(msg[1], new TypeError(`call data is not serializable: ${err.message}`))
    }
    return null
  }

  /** A part of a stream served here could not be sent: its iterator stops. */
  _stopStream (id) {
    for (const wire of this._wires()) {
      const task = wire.running.get(id)
      if (task !== undefined && task.window !== undefined) {
        wire.running.delete(id)
        task.controller.abort(new Error('a part could not be sent'))
      }
    }
  }

  /** Over the node's frame limit: a call fails here (nothing was sent); an answer becomes
   * PAYLOAD_TOO_LARGE for its caller (the call ran: never run again). */
  _oversized (msg, size, limit) {
    if (msg[0] === p.PART) this._stopStream(msg[1])
    if (msg[0] === p.REQUEST || msg[0] === p.STREAM || msg[0] === p.ALL) {
      this._finish(msg[1], new errors.PayloadTooLargeError(
        `the call's data makes a ${size}-byte message, over the node's limit of ${limit} bytes (max_frame); nothing was sent`))
      return null
    }
    if (msg[0] === p.EMIT) { // at most once: dropped, and said
      this.log.warn(`event_too_large topic=${msg[1]} size=${size} limit=${limit}`)
      return null
    }
    if (msg[0] === p.RESPONSE || msg[0] === p.PART) {
      return [p.ERROR, msg[1], 'PAYLOAD_TOO_LARGE',
        `the answer makes a ${size}-byte message, over the node's limit of ${limit} bytes (max_frame)`]
    }
    return msg
  }

  // -- failure ---------------------------------------------------------------------------

  _sweep () {
    this._held.tick(now())
    for (const ref of this._deadlines.expire(now())) {
      const entry = this._pending.get(ref)
      if (entry === undefined) continue
      this._finish(ref, entry.wire === null
        ? new errors.ConnectionLostError('no connection within the deadline')
        : new errors.ResponseTimeoutError('no answer from the node within the deadline'))
    }
  }

  /** The node shuts down: new calls wait for a connection to another node. */
  _nodeDraining (wire) {
    if (wire.draining) return
    wire.draining = true
    this.log.info(`node_draining url=${wire.url}`)
    if (wire === this._wire && !this.closed) {
      this._draining.add(wire)
      this._wire = null
      this._startReconnect(wire.url, true)
    }
  }

  /** The node cannot reach the cluster: move to another URL if one answers (calls and
   * handlers under way on this connection finish there), else stay. */
  _nodeCutOff (wire) {
    if (wire !== this._wire || this.closed || !this.reconnect || this.urls.length < 2 || this._moving) return
    this.log.info(`node_cut_off url=${wire.url}`)
    this._moving = true
    this._connectAny(wire.url, true).then((fresh) => {
      this._moving = false
      if (fresh === null) {
        this.log.info(`node_cut_off_staying url=${wire.url} error=${this._lastError}`)
        return
      }
      if (this.closed || this._wire !== wire) { // closed, or it moved meanwhile
        fresh.close()
        return
      }
      wire.draining = true
      this._draining.add(wire)
      this._use(fresh) // provides here what it provided, sends what waited
      if (this._handlers.size && wire.open) wire.send([p.UNPROVIDE, this._ids++, [...this._handlers.keys()]])
      this._closeWhenIdle(wire)
    })
  }

  /** Close a connection new calls no longer use once its calls and handlers ended. */
  _closeWhenIdle (wire) {
    const busy = () => wire.running.size > 0 || [...this._pending.values()].some((e) => e.wire === wire)
    const check = () => {
      if (!this.closed && !wire.lost && busy()) {
        setTimeout(check, 100)
        return
      }
      this._draining.delete(wire)
      if (!wire.lost) wire.close()
    }
    check()
  }

  _onLost (wire, ev) {
    if (wire.lost) return
    wire.lost = true
    this._draining.delete(wire)
    const lost = new errors.ConnectionLostError(
      `connection to ${wire.url} lost (${ev && ev.code})`)
    for (const task of wire.running.values()) task.controller.abort(lost) // nowhere to answer
    wire.running.clear()
    for (const [ref, entry] of [...this._pending]) {
      if (entry.wire !== wire) continue
      if (entry.idempotent && this.reconnect && !this.closed) {
        entry.wire = null // send it again on the next connection
        entry.maybeRan = true
        this._queued.push(ref)
        continue
      }
      this._finish(ref, lost)
    }
    if (wire !== this._wire) return // a draining wire: the client moved already
    this._wire = null
    if (this.closed) return
    if (this._topics.size) this._gap(null, null) // what is emitted until the next connection is lost
    if (!this.reconnect) {
      this.closed = true
      this._failAll(lost)
      this._setState('closed')
      return
    }
    this._startReconnect(wire.url, false)
  }

  _startReconnect (avoid, atOnce) {
    this._setState('reconnecting')
    if (this._reconnecting) return
    this._reconnecting = true
    const attempt = async (first) => {
      this._reconnectTimer = null
      if (this.closed) { this._reconnecting = false; return }
      const wire = await this._connectAny(avoid)
      if (this.closed) {
        this._reconnecting = false
        if (wire) wire.close()
        return
      }
      if (wire !== null) {
        this._reconnecting = false
        this._use(wire)
        return
      }
      this.log.info(`client_reconnect_failed error=${this._lastError}`)
      this._reconnectTimer = setTimeout(() => attempt(false), this.backoff.next())
    }
    if (atOnce) attempt(true)
    else this._reconnectTimer = setTimeout(() => attempt(true), this.backoff.next())
  }

  _failAll (err) {
    clearInterval(this._sweeper)
    this._sweeper = null
    clearTimeout(this._reconnectTimer)
    this._queued = []
    for (const ref of [...this._pending.keys()]) this._finish(ref, err)
    for (const wire of this._wires()) {
      for (const task of wire.running.values()) task.controller.abort(err)
      wire.running.clear()
    }
    for (const resolve of this._waiting.splice(0)) resolve()
  }
}

/**
 * Connect to the first reachable node of `urls` (ws:// or wss://, one or a list).
 * Rejects with ConnectFailedError when none can be reached, and with the node's
 * AUTH_FAIL as an RpcError (NotAuthenticatedError, RateLimitedError) when refused.
 */
export async function connect (urls, options) {
  return new Client(urls, options)._open()
}
