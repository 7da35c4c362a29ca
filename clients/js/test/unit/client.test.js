// The client's state machine against a scripted node: a fake WebSocket class given to
// connect(), so every step is explicit (no sockets, no timing beyond a tick).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { decode, encode } from '@msgpack/msgpack'
import { connect, Backoff, ConnectionLostError, NotAuthenticatedError, RpcError } from '../../src/index.js'

// a few turns of the loop: the client's promise chains and its end-of-tick flush run
const tick = async () => { for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve)) }

/** A scripted network: every socket the client opens, by URL; nodes answer by hand. */
function network ({ refuse = [], starting = {}, status = 503 } = {}) {
  const sockets = []
  class FakeSocket {
    constructor (url) {
      this.url = url
      this.readyState = 0
      this.frames = [] // what the client sent, decoded: one array of messages per frame
      sockets.push(this)
      setImmediate(() => {
        if (refuse.includes(url)) return this.drop(1006)
        if (starting[url] > 0) { // a node still joining (503), or busy (429): ws reports it
          starting[url] -= 1
          this.onerror?.({ message: `Unexpected server response: ${status}` })
          return this.drop(1006)
        }
        this.readyState = 1
        this.onopen?.({})
      })
    }

    send (data) { const m = decode(data); this.frames.push(Number.isInteger(m[0]) ? [m] : m) }
    close (code = 1000) { if (this.readyState < 2) this.drop(code) }
    drop (code) { this.readyState = 3; this.onclose?.({ code, reason: '' }) }
    deliver (...msgs) { this.onmessage({ data: encode(msgs.length === 1 ? msgs[0] : msgs) }) }
    get messages () { return this.frames.flat() }
    sent (kind) { return this.messages.filter((m) => m[0] === kind) }
  }
  const net = { sockets, FakeSocket }
  /** Open a client on `urls`, the first live node answering AUTH. */
  net.client = async (urls, options = {}) => {
    const pending = connect(urls, { WebSocket: FakeSocket, backoff: new Backoff(1, 2, () => 0), ...options })
    await net.authenticate()
    return pending
  }
  net.authenticate = async (session = {}) => {
    // until the client has sent AUTH: by time, not by turns of the loop, since its
    // reconnect backoff (1-2 ms here) is a timer that a busy machine fires late
    for (const until = Date.now() + 5000; Date.now() < until;) {
      const s = sockets.at(-1)
      if (s && s.readyState === 1 && s.sent(1).length > (s.authed ?? 0)) {
        s.authed = s.sent(1).length
        s.deliver([2, { node: 'n', session: 's1', user: null, protocol: 1, max_frame: 1 << 20, ack_timeout_ms: 1000, response_timeout_ms: 10000, ...session }])
        return s
      }
      await tick()
      await new Promise((resolve) => setTimeout(resolve, 1))
    }
    throw new Error('no AUTH sent within 5 s')
  }
  return net
}

test('calls made in one tick leave in one frame; answers find their calls in any order', async () => {
  const net = network()
  const c = await net.client('ws://a')
  const [s] = net.sockets
  const calls = [1, 2, 3].map((i) => c.call('math.add', { a: i }, { timeout: 500 }))
  await tick()
  const frame = s.frames.at(-1)
  assert.deepEqual(frame.map((m) => [m[0], m[2], m[3], m[4]]), [1, 2, 3].map((i) => [16, 'math.add', { a: i }, 500]))
  s.deliver(...frame.reverse().map((m) => [18, m[1], m[3].a * 10]))
  assert.deepEqual(await Promise.all(calls), [10, 20, 30])
  s.deliver([18, 999, 'late']) // an answer nobody waits for is dropped
  await c.close()
  assert.equal(c.state, 'closed')
})

test('a lost connection: sent calls fail, idempotent ones go again, names are provided again on the next URL', async () => {
  const net = network()
  const states = []
  const lines = []
  const c = await net.client(['ws://a', 'ws://b'], { onState: (s) => states.push(s), logger: { info: (m) => lines.push(m), warn: (m) => lines.push(m) } })
  const [a] = net.sockets
  const provided = c.provide('js.echo', (d) => d)
  await tick()
  a.deliver([6, a.sent(4)[0][1]])
  await provided
  const plain = c.call('x', 1, { timeout: 5000 })
  const again = c.call('x', 2, { timeout: 5000, idempotent: true })
  await tick()
  a.drop(1006)
  await assert.rejects(plain, ConnectionLostError)
  const waited = c.call('x', 3, { timeout: 5000 }) // made while disconnected: waits, then goes
  const b = await net.authenticate()
  assert.equal(b.url, 'ws://b')
  await tick()
  assert.deepEqual(b.sent(4).map((m) => m[2]), [['js.echo']])
  const requests = b.sent(16)
  assert.deepEqual(requests.map((m) => m[3]), [2, 3])
  assert.ok(requests.every((m) => m[4] > 4000 && m[4] <= 5000)) // the time they have left
  b.deliver(...requests.map((m) => [18, m[1], m[3] * 2]))
  assert.deepEqual(await Promise.all([again, waited]), [4, 6])
  assert.deepEqual(states, ['connected', 'reconnecting', 'connected'])
  await c.close()
  // every state line names a node: the one it is on, or was on last
  assert.deepEqual(lines.filter((m) => m.startsWith('client_')),
    ['client_connected url=ws://a', 'client_reconnecting url=ws://a', 'client_connected url=ws://b', 'client_closed url=ws://b'])
})

test('a client that moved gets no event twice: one no newer than its origin gave it already is dropped', async () => {
  const net = network()
  const got = []
  const c = await net.client(['ws://a', 'ws://b'], { logger: { info: () => {}, warn: () => {} } })
  const [a] = net.sockets
  assert.equal(a.sent(1)[0][1].event_origins, true) // it asks for the numbers
  const subscribed = c.subscribe('t', (d) => got.push(d))
  await tick()
  a.deliver([6, a.sent(32)[0][1]])
  await subscribed
  a.deliver([35, 't', 'a', 3, 1], [35, 't', 'b', 3, 2]) // from n3 (origin 3) itself
  await tick()
  a.drop(1006)
  const b = await net.authenticate()
  await tick()
  b.deliver([6, b.sent(32)[0][1]])
  // on b, off the bus, late: n3's first two again, then its next; b's own; an old node's
  b.deliver([35, 't', 'a', 3, 1], [35, 't', 'b', 3, 2], [35, 't', 'c', 3, 3], [35, 't', 'own', 2, 1], [35, 't', 'plain'])
  await tick()
  assert.deepEqual(got, ['a', 'b', 'c', 'own', 'plain'])
  assert.equal(c.eventsRepeated, 2)
  await c.close()
})

test('a node shutting down: new calls go to another node, refused ones are sent again, the rest finish there', async () => {
  const net = network()
  const c = await net.client(['ws://a', 'ws://b'])
  const [a] = net.sockets
  const inFlight = c.call('slow', 'before')
  const refused = c.call('x', 'refused')
  await tick()
  const [slow, x] = a.sent(16)
  a.deliver([20, null, 'SHUTTING_DOWN', 'going'], [30, 'rpcbus-draining'], [20, x[1], 'SHUTTING_DOWN', 'no'])
  await tick()
  assert.deepEqual(a.sent(31), [[31, 'rpcbus-draining']]) // what it sent before is read
  const b = await net.authenticate()
  const after = c.call('x', 'after')
  await tick()
  assert.deepEqual(b.sent(16).map((m) => m[3]), ['refused', 'after'])
  a.deliver([18, slow[1], 'done there'])
  b.deliver(...b.sent(16).map((m) => [18, m[1], m[3] + '!']))
  assert.deepEqual(await Promise.all([inFlight, refused, after]), ['done there', 'refused!', 'after!'])
  assert.equal(c.url, 'ws://b')
  await c.close()
})

test('a node cut off from the cluster: the client moves to another URL, provides there, and leaves once its call there ended', async () => {
  const net = network({ refuse: [] })
  const c = await net.client(['ws://a', 'ws://b'])
  const [a] = net.sockets
  const provided = c.provide('js.echo', (d) => d)
  await tick()
  a.deliver([6, a.sent(4)[0][1]])
  await provided
  const inFlight = c.call('slow', 'there', { timeout: 5000 })
  await tick()
  const [slow] = a.sent(16)
  a.deliver([20, null, 'CLUSTER_UNAVAILABLE', 'this node cannot reach the cluster: connect to another node'])
  const b = await net.authenticate()
  assert.equal(b.url, 'ws://b')
  await tick()
  assert.deepEqual(b.sent(4).map((m) => m[2]), [['js.echo']]) // provided on b
  assert.deepEqual(a.sent(5).map((m) => m[2]), [['js.echo']]) // withdrawn from a
  const after = c.call('x', 'here', { timeout: 5000 })
  await tick()
  assert.deepEqual(b.sent(16).map((m) => m[3]), ['here'])
  b.deliver(...b.sent(16).map((m) => [18, m[1], m[3] + '!']))
  assert.equal(a.readyState, 1) // its call there is still under way
  a.deliver([18, slow[1], 'done there'])
  assert.deepEqual(await Promise.all([inFlight, after]), ['done there', 'here!'])
  for (let i = 0; i < 50 && a.readyState === 1; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  assert.notEqual(a.readyState, 1) // left once idle
  assert.equal(c.url, 'ws://b')
  await c.close()
})

test('a node that takes ACCEPT_UPTO gets one for a frame of REQUESTs, after its REJECTs, before any handler runs', async () => {
  const net = network()
  const pending = connect('ws://a', { WebSocket: net.FakeSocket })
  const s = await net.authenticate({ accept_upto: true })
  const c = await pending
  const ran = []
  const provided = c.provide('now', (d) => { ran.push(d); return d })
  await tick()
  s.deliver([6, s.sent(4)[0][1]])
  await provided
  s.deliver([16, 7, 'now', 1, 1000, 'c@s', 0], [16, 8, 'gone', 2, 1000, 'c@s', 0], [16, 9, 'now', 3, 1000, 'c@s', 0])
  assert.deepEqual(s.frames.at(-1), [[19, 8], [22, 9]]) // written while the frame was read
  assert.deepEqual(ran, [1, 3])
  await tick()
  assert.deepEqual(s.frames.at(-1), [[18, 7, 1], [18, 9, 3]])
  await c.close()
})

test('connect waits for a node still starting (HTTP 503) or busy (429) within openTimeout', async () => {
  const net = network({ starting: { 'ws://a': 2 } })
  const c = await net.client('ws://a', { openTimeout: 5000 })
  assert.equal(net.sockets.length, 3) // refused twice while it joined, then in
  assert.equal(c.state, 'connected')
  await c.close()
  const busy = network({ starting: { 'ws://a': 2 }, status: 429 }) // too many connecting
  const d = await busy.client('ws://a', { openTimeout: 5000 })
  assert.equal(busy.sockets.length, 3)
  await d.close()
  const refused = network({ refuse: ['ws://b'] })
  await assert.rejects(connect('ws://b', { WebSocket: refused.FakeSocket }), /cannot connect/)
  assert.equal(refused.sockets.length, 1) // nothing listening: fails at once
})

test('handlers: every call ACCEPTed before its handler runs; CANCEL aborts and drops the answer', async () => {
  const net = network()
  const c = await net.client('ws://a')
  const [s] = net.sockets
  let release
  const aborted = []
  await Promise.all([
    c.provide('now', (d) => d + 1),
    c.provide('soon', async (d) => d + 2),
    c.provide('later', (d, ctx) => new Promise((resolve) => { release = resolve; ctx.signal.onabort = () => aborted.push(ctx.callId) })),
    c.provide('fails', () => { throw new TypeError('bad input') }),
    (async () => { await tick(); for (const m of s.sent(4)) s.deliver([6, m[1]]) })(),
  ])
  s.deliver([16, 1, 'now', 1, 1000, 'c@s', 0], [16, 2, 'soon', 1, 1000, 'c@s', 0], [16, 3, 'later', 1, 1000, 'c@s', 0],
    [16, 4, 'fails', 1, 1000, 'c@s', 0], [16, 5, 'nobody-here', 1, 1000, 'c@s', 0])
  // the ACCEPTs (and the refusal) are written while the frame is read, before any handler
  const [accepted] = s.frames.slice(-1)
  assert.deepEqual(accepted, [[17, 1], [17, 2], [17, 3], [17, 4], [19, 5]])
  await tick()
  assert.deepEqual(s.frames.at(-1), [[18, 1, 2], [20, 4, 'PROVIDER_ERROR', 'TypeError: bad input'], [18, 2, 3]])
  s.deliver([21, 3]) // the node gave it up
  release('too late')
  await tick()
  assert.deepEqual(aborted, [3])
  assert.equal(s.messages.filter((m) => m[1] === 3 && m[0] === 18).length, 0)
  // a REQUEST read far later than its stamp says is refused unrun
  s.deliver([16, 6, 'now', 1, 1000, 'c@s', 10000])
  s.deliver([16, 7, 'now', 1, 1000, 'c@s', -10000])
  await tick()
  assert.deepEqual(s.frames.slice(-2), [[[17, 6]], [[18, 6, 2], [19, 7, 'LATE']]])
  assert.equal(c.staleRequests, 1)
  await c.close()
})

test('AUTH_FAIL BUSY is asked again; a refusal fails connect with its code', async () => {
  const net = network()
  const pending = connect('ws://a', { WebSocket: net.FakeSocket })
  for (let i = 0; i < 50 && !net.sockets[0]?.sent(1).length; i++) await tick()
  const [s] = net.sockets
  s.deliver([3, 'BUSY', 'checks all taken'])
  for (let i = 0; i < 200 && s.sent(1).length < 2; i++) await new Promise((resolve) => setTimeout(resolve, 5))
  assert.equal(s.sent(1).length, 2)
  s.deliver([3, 'NOT_AUTHENTICATED', 'authentication failed'])
  await assert.rejects(pending, (e) => e instanceof NotAuthenticatedError && e.code === 'NOT_AUTHENTICATED')
  const none = network({ refuse: ['ws://x', 'ws://y'] })
  await assert.rejects(connect(['ws://x', 'ws://y'], { WebSocket: none.FakeSocket }),
    (e) => e instanceof RpcError && e.code === 'CONNECT_FAILED' && /ws:\/\/y/.test(e.message))
})
