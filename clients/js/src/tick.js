// "At the end of this tick": what the client queues while handling one event (a frame, a
// burst of call() in one function) leaves together. Node: setImmediate. Browsers: a
// MessageChannel message, which runs after the current task and its promise jobs without
// the 1-4 ms clamp of setTimeout.

let schedule
if (typeof setImmediate === 'function') {
  schedule = (fn) => { setImmediate(fn) }
} else if (typeof MessageChannel === 'function') {
  const channel = new MessageChannel()
  const queue = []
  channel.port1.onmessage = () => {
    const fns = queue.splice(0, queue.length)
    for (const fn of fns) fn()
  }
  schedule = (fn) => {
    queue.push(fn)
    if (queue.length === 1) channel.port2.postMessage(0)
  }
} else {
  schedule = (fn) => { setTimeout(fn, 0) }
}

/** Run `fn` once the current task and the promise jobs it started have run. */
export const afterTick = schedule
