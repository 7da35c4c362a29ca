// Deadlines for many pending calls: O(1) filing, swept in bulk by one timer (no timer per
// call). A port of the Python SDK's rpcbus.deadlines; pure: the caller gives the clock.
// Keys are never removed early: the owner forgets finished calls in its own table and
// ignores swept keys it no longer knows.

export class Deadlines {
  constructor (granularityMs, now) {
    this.granularity = granularityMs
    this.buckets = new Map()
    this.nextSlot = Math.floor(now / granularityMs) // lowest slot not yet swept
  }

  /** File `key`, due at `deadline` (ms); one already past is due at the next sweep. */
  add (key, deadline) {
    let slot = Math.ceil(deadline / this.granularity)
    if (slot < this.nextSlot) slot = this.nextSlot
    let bucket = this.buckets.get(slot)
    if (bucket === undefined) { bucket = []; this.buckets.set(slot, bucket) }
    bucket.push(key)
  }

  /** Remove and return every key due at or before `now`, oldest first. */
  expire (now) {
    const last = Math.floor(now / this.granularity)
    if (last < this.nextSlot) return []
    const slots = [...this.buckets.keys()].filter((s) => s <= last).sort((a, b) => a - b)
    const due = []
    for (const slot of slots) {
      due.push(...this.buckets.get(slot))
      this.buckets.delete(slot)
    }
    this.nextSlot = last + 1
    return due
  }
}
