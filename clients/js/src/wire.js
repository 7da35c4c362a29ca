// One WebSocket connection of a Client: messages out coalesced per tick into one frame
// (split only at the node's max_frame / max_frame_messages), frames in handed to the client.

import { afterTick } from './tick.js'
import { encodeMessage, MAX_FRAME_MESSAGES, packInFrames, SENT } from './protocol.js'
import { Staleness } from './staleness.js'

const OPEN = 1

export class Wire {
  constructor (client, url, ws) {
    this.client = client
    this.url = url
    this.ws = ws
    this.session = null // the node's AUTH_OK
    this.draining = false // its node is shutting down: no new calls here
    this.lost = false
    this.expired = false // its session's token expired: rights ended until renewed
    this.out = []
    this.scheduled = false
    this.maxFrame = 1 << 20
    this.maxMessages = MAX_FRAME_MESSAGES
    this.staleness = new Staleness()
    this.running = new Map() // attempt id -> AbortController of a handler still running
    this.framesOut = 0
    this.droppedOut = 0
    this.stamps = false // the node takes SENT: frames with calls begin with one
    this.stamp = 0 // when the outbox's first call was queued (0: none is)
  }

  get open () { return !this.lost && this.ws.readyState === OPEN }

  /** Queue a message; it leaves with everything else queued in this tick. */
  send (msg) {
    this.out.push(msg)
    this.schedule()
  }

  /** Queue a call (REQUEST, STREAM, ALL): with `stamps`, its frame begins with a SENT
   * saying when its first call was queued (its caller's clock runs from then), so the
   * node counts the time it took to be read, this program's own lag too. */
  sendCall (msg) {
    if (this.stamps && this.stamp === 0) this.stamp = Math.max(1, globalThis.performance.now())
    this.send(msg)
  }

  /** Make sure a flush runs at the end of this tick. */
  schedule () {
    if (!this.scheduled) {
      this.scheduled = true
      afterTick(() => this.flush())
    }
  }

  /** Write everything queued: one frame, more only when over the node's limits. */
  flush () {
    this.scheduled = false
    const out = this.out
    if (out.length === 0) return
    this.out = []
    const stamp = this.stamp
    this.stamp = 0
    if (!this.open) {
      this.droppedOut += out.length
      return
    }
    if (stamp !== 0) out.unshift([SENT, Math.floor(stamp)])
    let frames = null
    if (out.length <= this.maxMessages) {
      try {
        const data = encodeMessage(out.length === 1 ? out[0] : out)
        if (data.length <= this.maxFrame) frames = [data]
      } catch { /* one of them cannot be encoded: find it below */ }
    }
    if (frames === null) frames = this.encodeEach(out, stamp !== 0)
    for (const frame of frames) this.ws.send(frame)
    this.framesOut += frames.length
  }

  /** Each message packed alone: what msgpack refuses or what is over max_frame goes to the
   * client, which fails the call or replaces the answer; the rest in bounded frames.
   * `stamped`: `out` begins with a SENT, which then begins every frame. */
  encodeEach (out, stamped = false) {
    const parts = []
    const head = stamped ? encodeMessage(out[0]) : null
    for (const msg of stamped ? out.slice(1) : out) {
      let part
      try {
        part = encodeMessage(msg)
      } catch (err) {
        const replacement = this.client._unencodable(msg, err)
        if (replacement) parts.push(encodeMessage(replacement))
        continue
      }
      if (part.length > this.maxFrame) {
        const replacement = this.client._oversized(msg, part.length, this.maxFrame)
        if (!replacement) continue
        if (replacement !== msg) part = encodeMessage(replacement)
      }
      parts.push(part)
    }
    return parts.length ? packInFrames(parts, this.maxFrame, this.maxMessages, head) : []
  }

  close (code = 1000) {
    try { this.ws.close(code) } catch { /* closing already */ }
  }
}
