// The node's send stamp check on REQUESTs (docs/protocol.md: `sent_ms`). Pure: the caller
// gives the read time.
//
// The node moves an attempt to another provider after its ack timeout, so a REQUEST read
// later than that (this program was stalled or starved) may run elsewhere too. The least
// (read - sent) seen over the last window stands for the clocks' offset plus the least
// delay; a REQUEST read more than `staleAfterMs` (half the ack timeout) after that is
// refused unrun (REJECT). It underestimates an age, never overestimates it, so a fresh
// REQUEST is never refused, and it follows clock drift window by window.

export class Staleness {
  constructor (staleAfterMs = 500, windowMs = 30000) {
    this.staleAfterMs = staleAfterMs
    this.windowMs = windowMs
    this.skew = null
    this.skewNext = null
    this.skewUntil = 0
  }

  /** True when a REQUEST stamped `sentMs` by the node and read at `readMs` is too old. */
  stale (sentMs, readMs) {
    if (typeof sentMs !== 'number' || !Number.isFinite(sentMs)) return false
    const seen = readMs - sentMs
    if (readMs >= this.skewUntil) { // a new window: keep the last one's minimum
      if (this.skewNext !== null) this.skew = this.skewNext
      this.skewNext = null
      this.skewUntil = readMs + this.windowMs
    }
    if (this.skewNext === null || seen < this.skewNext) this.skewNext = seen
    if (this.skew === null || seen < this.skew) this.skew = seen
    return seen - this.skew > this.staleAfterMs
  }
}
