// Streams (docs/protocol.md, "Streams"): a call whose answer comes in parts, with a
// credit window as in the Python SDK (clients/streaming.py, clients/streams.py).
//
// The caller: `client.stream(name, data, {timeout, signal, window})` is an async iterable;
// `for await (const part of ...)` reads the parts in order and ends when the provider's
// iterator ends, or throws its error after the parts before it. Leaving the loop early
// (break, return, throw: the loop calls `return()`), aborting `signal`, or the deadline
// cancels the provider's iterator, on any node. The provider may send `window` parts ahead
// of the reading; CREDIT (the parts read in all) goes back half a window at a time.
//
// The provider: a handler that returns an async iterable or a generator (`async function*`,
// `function*`) serves a stream; its next part is asked for only while the caller has given
// credit, so a caller that stops reading stops it. A CANCEL aborts `ctx.signal` and calls the
// iterator's `return()` (its `finally` runs).

import * as p from './protocol.js'

export const DEFAULT_WINDOW = 64
export const MAX_WINDOW = 1024

/** The caller's side of one stream: parts read ahead, and the count read to tell. */
export class Inflow {
  constructor (window) {
    this.window = window
    this.parts = []
    this.head = 0
    this.taken = 0 // parts the application took
    this.credited = 0 // `taken` as last told (CREDIT)
  }

  get size () { return this.parts.length - this.head }

  /** A part came; false when it is past the window (the node broke the flow control). */
  arrived (data) {
    if (this.taken + this.size >= this.credited + this.window) return false
    this.parts.push(data)
    return true
  }

  /** The next part and the CREDIT to send now: the parts taken in all, every half window
   * (0: none yet). */
  take () {
    const part = this.parts[this.head]
    this.parts[this.head++] = undefined
    if (this.head > 64 && this.head * 2 > this.parts.length) {
      this.parts = this.parts.slice(this.head)
      this.head = 0
    }
    this.taken += 1
    if (this.taken - this.credited >= Math.ceil(this.window / 2)) {
      this.credited = this.taken
      return [part, this.taken]
    }
    return [part, 0]
  }
}

/** True for what a handler returns to answer in parts: an async iterable or a generator. */
export function isParts (value) {
  if (value === null || typeof value !== 'object') return false
  if (typeof value[Symbol.asyncIterator] === 'function') return true
  return Object.prototype.toString.call(value) === '[object Generator]'
}

/** The async iterable `client.stream` returns. `entry` is the call's record in the
 * client's table of calls (its end settles it, as a call's answer does). */
export class Stream {
  constructor (client, open) {
    this.client = client
    this.open = open // () => entry: sends the STREAM
    this.entry = null
    this.done = false
  }

  [Symbol.asyncIterator] () { return this }

  async next () {
    if (this.done) return { value: undefined, done: true }
    if (this.entry === null) this.entry = this.open()
    const entry = this.entry
    for (;;) {
      if (entry.inflow.size) {
        const [part, credit] = entry.inflow.take()
        if (credit && entry.wire !== null && entry.wire.open) entry.wire.send([p.CREDIT, entry.ref, credit])
        return { value: part, done: false }
      }
      if (entry.ended !== null) {
        this.done = true
        if (entry.ended.err !== undefined) throw entry.ended.err
        return { value: undefined, done: true }
      }
      await new Promise((resolve) => { entry.wake = resolve })
    }
  }

  /** Stop reading: the provider is told (CANCEL) unless the stream has ended. */
  async return () {
    if (!this.done) {
      this.done = true
      const entry = this.entry
      if (entry !== null && entry.ended === null) this.client._abandonStream(entry)
    }
    return { value: undefined, done: true }
  }
}

/** Serve one STREAM: the iterator's parts as PARTs while the caller has read enough
 * (`task.sent - task.read < task.window`), then RESPONSE (null), or its error. A CANCEL
 * (task.controller aborted) stops it and calls `return()`. */
export async function serveParts (client, wire, id, name, task, parts, failure) {
  const it = typeof parts[Symbol.asyncIterator] === 'function' ? parts[Symbol.asyncIterator]() : parts
  const signal = task.controller.signal
  const wake = () => { const w = task.wake; task.wake = null; if (w) w() }
  signal.addEventListener('abort', wake, { once: true })
  let finished = false
  try {
    for (;;) {
      while (task.sent - task.read >= task.window && !signal.aborted) await new Promise((resolve) => { task.wake = resolve })
      if (signal.aborted) return
      const { value, done } = await it.next()
      if (signal.aborted) return
      if (done) {
        finished = true
        client._taskDone(wire, id, task, [p.RESPONSE, id, null])
        return
      }
      task.sent += 1
      wire.send([p.PART, id, value === undefined ? null : value])
    }
  } catch (err) {
    finished = true
    client._taskDone(wire, id, task, failure(id, err, client.log, name))
  } finally {
    signal.removeEventListener('abort', wake)
    if (!finished && typeof it.return === 'function') {
      try { await it.return() } catch (err) { client.log.warn(`stream_close_failed rpc=${name} call_id=${id}: ${err}`) }
    }
  }
}
