// The node's send stamp check on REQUESTs (docs/protocol.md: `sent_ms`). Pure: the caller
// gives the read time.
//
// The node moves an attempt to another provider after its ack timeout, so a REQUEST read
// later than that (this program was stalled or starved) may run elsewhere too. The least
// (read - sent) seen over the last window stands for the clocks' offset plus the least
// delay; a REQUEST read more than `staleAfterMs` (half the ack timeout AUTH_OK gave, or
// half the REQUEST's own `ack_ms` when it carries one) after that is refused unrun
// (REJECT LATE). It underestimates an age, never overestimates it, so a fresh
// REQUEST is never refused, and it follows clock drift window by window.
//
// A REQUEST read late because the program was held (`lateByMs`, from `Held`: how long its
// frame may have waited after it arrived) says nothing of the clocks: it is judged, but
// never taken as the offset; with no offset known yet (a connection's first REQUESTs), one
// that may have waited over `staleAfterMs` is stale.

const HELD_MS = 20 // a frame that may have waited longer than this was read late

export class Staleness {
  constructor (staleAfterMs = 500, windowMs = 30000) {
    this.staleAfterMs = staleAfterMs
    this.windowMs = windowMs
    this.skew = null
    this.skewNext = null
    this.skewUntil = 0
  }

  /** True when a REQUEST stamped `sentMs` by the node and read at `readMs` is too old;
   * its frame may have waited `lateByMs` after it arrived. */
  stale (sentMs, readMs, lateByMs = 0, afterMs = 0, leftMs = 0) {
    if (typeof sentMs !== 'number' || !Number.isFinite(sentMs)) return false
    // the REQUEST's own bound (half its ack_ms), if any; and one older than its time left
    // is stale too: its caller has stopped waiting, so no handler starts for it
    let bound = afterMs || this.staleAfterMs
    if (typeof leftMs === 'number' && leftMs > 0 && leftMs < bound) bound = leftMs
    const seen = readMs - sentMs
    if (lateByMs > HELD_MS) {
      if (this.skew === null) return lateByMs > bound
      return seen - this.skew > bound
    }
    if (readMs >= this.skewUntil) { // a new window: keep the last one's minimum
      if (this.skewNext !== null) this.skew = this.skewNext
      this.skewNext = null
      this.skewUntil = readMs + this.windowMs
    }
    if (this.skewNext === null || seen < this.skewNext) this.skewNext = seen
    if (this.skew === null || seen < this.skew) this.skew = seen
    return seen - this.skew > bound
  }
}

// When the program was held, from a tick the client runs every `intervalMs`: how long a
// frame read now may have waited after it arrived. Node.js runs the late timer before the
// frame's I/O; both orders are seen.
export class Held {
  constructor (intervalMs, nowMs) {
    this.intervalMs = intervalMs
    this.ticked = nowMs
    this.stallAt = -Infinity
    this.stall = 0
  }

  tick (nowMs) {
    const gap = nowMs - this.ticked - this.intervalMs
    if (gap > 0) {
      this.stallAt = nowMs
      this.stall = gap
    }
    this.ticked = nowMs
  }

  /** Milliseconds a frame read at `nowMs` may have waited (0: the program ran freely). */
  lateBy (nowMs) {
    let late = nowMs - this.ticked - this.intervalMs
    if (nowMs - this.stallAt < this.intervalMs && this.stall > late) late = this.stall
    return Math.max(late, 0)
  }
}
