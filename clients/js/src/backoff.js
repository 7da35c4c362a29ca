// Exponential backoff with full jitter, as the Python SDK's rpcbus.backoff (seconds there,
// milliseconds here). Pure: the random source is an argument.

export class Backoff {
  constructor (minimum = 50, maximum = 5000, rand = Math.random) {
    this.minimum = minimum
    this.maximum = maximum
    this.rand = rand
    this.attempt = 0
  }

  /** The delay (ms) before the next attempt. */
  next () {
    const ceiling = Math.min(this.maximum, this.minimum * 2 ** Math.min(this.attempt, 60))
    this.attempt += 1
    return this.minimum / 2 + this.rand() * (ceiling - this.minimum / 2)
  }

  reset () { this.attempt = 0 }
}
