// Which events a client had already: the newest number had of each topic and origin (the
// node process an event was emitted on). An origin's events of one topic reach any node
// in the order it numbered them, so one no newer than the last had was had already: the
// client moved from the origin node to another, which gave it again, off the cluster bus,
// what the first one had handed it (docs/events.md, "At most once"). The Python SDK's
// clients/events.py `Seen` is the same rule.

const MAX_ORIGINS = 64 // per topic (nodes restart under new origins): the longest unheard goes

export class Seen {
  constructor () {
    this._last = new Map() // topic -> Map(origin -> newest number), most recently heard last
    this.repeats = 0
  }

  /** Whether the event `seq` of `topic` from `origin` is new here (then it is remembered). */
  fresh (topic, origin, seq) {
    let last = this._last.get(topic)
    if (last === undefined) this._last.set(topic, last = new Map())
    const had = last.get(origin)
    if (had !== undefined && seq <= had) {
      this.repeats += 1
      return false
    }
    if (had !== undefined) last.delete(origin)
    else if (last.size >= MAX_ORIGINS) last.delete(last.keys().next().value)
    last.set(origin, seq)
    return true
  }

  forget (topic) {
    this._last.delete(topic)
  }
}
