// The codec and the framing of batches, and the pure helpers (backoff, staleness,
// deadlines): no sockets.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { decode, encode } from '@msgpack/msgpack'
import * as p from '../../src/protocol.js'
import { Backoff } from '../../src/backoff.js'
import { Deadlines } from '../../src/deadlines.js'
import { Held, Staleness } from '../../src/staleness.js'
import { errorFromCode, NoProviderError, RpcError, CODES } from '../../src/errors.js'

test('a frame is one message or an array of them; anything else is refused', () => {
  assert.deepEqual(p.decodeFrame(encode([18, 7, { a: 1 }])), [[18, 7, { a: 1 }]])
  assert.deepEqual(p.decodeFrame(encode([[6, 1], [18, 2, null]])), [[6, 1], [18, 2, null]])
  for (const bad of [encode([]), encode('x'), encode([['x']]), encode([[6], 'y']), Uint8Array.of(0xc1), new Uint8Array(0)]) {
    assert.throws(() => p.decodeFrame(bad), p.ProtocolError)
  }
  assert.deepEqual(p.decodeFrame(Uint8Array.from(encode([6, 1])).buffer), [[6, 1]]) // an ArrayBuffer (browsers)
})

test('batches split at the frame size and message count, and decode back in order', () => {
  const parts = Array.from({ length: 25 }, (_, i) => p.encodeMessage([16, i, 'n', 'x'.repeat(40), null]))
  const bySize = p.packInFrames(parts, 200)
  assert.ok(bySize.length > 1)
  for (const frame of bySize) assert.ok(frame.length <= 200 || p.decodeFrame(frame).length === 1)
  const byCount = p.packInFrames(parts, 1 << 20, 10)
  assert.deepEqual(byCount.map((f) => p.decodeFrame(f).length), [10, 10, 5])
  const all = bySize.flatMap((f) => p.decodeFrame(f)).map((m) => m[1])
  assert.deepEqual(all, [...Array(25).keys()])
  const big = p.encodeMessage([18, 1, 'y'.repeat(500)]) // over the limit: alone, whole
  assert.deepEqual(p.packInFrames([parts[0], big, parts[1]], 100).map((f) => p.decodeFrame(f).length), [1, 1, 1])
  const sent = p.encodeMessage([p.SENT, 1234]) // begins every frame: each is timed by it
  const stamped = p.packInFrames(parts, 1 << 20, 10, sent).map((f) => p.decodeFrame(f))
  assert.deepEqual(stamped.map((msgs) => msgs.length), [10, 10, 8])
  for (const msgs of stamped) assert.deepEqual(msgs[0], [p.SENT, 1234])
  assert.deepEqual(stamped.flatMap((msgs) => msgs.slice(1)).map((m) => m[1]), [...Array(25).keys()])
  const many = Array.from({ length: 70000 }, () => p.encodeMessage([30]))
  const [frame] = p.packInFrames(many, 1 << 20, 100000) // a 32-bit array header
  assert.equal(frame[0], 0xdd)
  assert.equal(decode(frame).length, 70000)
})

test('what msgpack cannot carry is an error to the sender, not a broken frame', () => {
  assert.throws(() => p.encodeMessage([18, 1, () => 1]))
  assert.deepEqual(decode(p.encodeMessage([18, 1, { a: undefined, b: 1 }])), [18, 1, { b: 1 }])
  let deep = 1
  for (let i = 0; i < 1000; i++) deep = [deep]
  assert.equal(decode(p.encodeMessage(deep)).length, 1) // as deep as the node takes
})

test('rpc names follow the protocol', () => {
  for (const ok of ['a', 'math.add', 'A_1:b/c-d', 'x'.repeat(128)]) assert.ok(p.validName(ok), ok)
  for (const bad of ['', '.a', '-a', 'a b', 'x'.repeat(129), 'é', 7, null]) assert.ok(!p.validName(bad), String(bad))
})

test('errors carry their code, by class', () => {
  const e = errorFromCode('NO_PROVIDER', 'nobody')
  assert.ok(e instanceof NoProviderError && e instanceof RpcError && e instanceof Error)
  assert.equal(e.code, 'NO_PROVIDER')
  assert.equal(e.message, 'nobody') // the node's text, as Python's .message
  assert.equal(String(e), 'NO_PROVIDER: nobody') // as Python's str(err)
  assert.equal(e.detail, 'nobody')
  assert.equal(e.name, 'NoProviderError')
  assert.equal(errorFromCode('NO_PROVIDER').message, 'NO_PROVIDER')
  const other = errorFromCode('SOMETHING_NEW', 'x')
  assert.ok(other.constructor === RpcError && other.code === 'SOMETHING_NEW')
  for (const code of CODES) assert.equal(errorFromCode(code).code, code)
})

test('backoff doubles up to its ceiling, with full jitter, and resets', () => {
  const top = new Backoff(100, 1000, () => 1)
  assert.deepEqual([1, 2, 3, 4, 5, 6].map(() => top.next()), [100, 200, 400, 800, 1000, 1000])
  top.reset()
  assert.equal(top.next(), 100)
  const bottom = new Backoff(100, 1000, () => 0)
  assert.deepEqual([1, 2, 3].map(() => bottom.next()), [50, 50, 50])
})

test('the send stamp check refuses only what was read late, whatever the clocks offset', () => {
  const s = new Staleness(500, 30000)
  const offset = 1e9 // the node's clock is not ours: it stamps our time + offset
  const at = (sent, read) => s.stale(sent + offset, read)
  assert.equal(at(998, 1000), false) // 2 ms on the way: the least delay seen
  assert.equal(at(3000, 3300), false) // 300 ms late: under half the ack timeout
  assert.equal(at(3000, 3702), true) // 700 ms late: the node may have moved it on
  assert.equal(s.stale('x', 4000), false) // no stamp: nothing to say
  // the node's clock jumps back 600 ms: refused for up to a window, then followed
  assert.equal(at(40000, 40602), true)
  assert.equal(at(71000, 71602), false)
  assert.equal(at(72000, 72602), false)
})

test('a REQUEST read after the program was held never becomes the clocks offset', () => {
  const s = new Staleness(500, 30000)
  assert.equal(s.stale(1000, 2000, 1000), true) // first on the connection, held 1 s: unknown
  assert.equal(s.stale(2000, 2000), false) // read at once: the offset is 0
  assert.equal(s.stale(2100, 2900, 800), true) // 800 ms old
  assert.equal(s.stale(2800, 2900, 800), false) // held, but sent late in the hold
  const held = new Held(50, 0)
  held.tick(50)
  assert.equal(held.lateBy(70), 0)
  assert.equal(held.lateBy(1100), 1000) // the frame before the late tick
  held.tick(1100)
  assert.equal(held.lateBy(1100), 1000) // Node.js: the late timer first
  held.tick(1150)
  assert.equal(held.lateBy(1160), 0)
})

test('deadlines come due in bulk, never early', () => {
  const d = new Deadlines(50, 0)
  d.add('a', 120); d.add('b', 40); d.add('c', 1000); d.add('late', -5)
  assert.deepEqual(d.expire(49), ['late']) // already past when filed: the next sweep
  assert.deepEqual(d.expire(60), ['b'])
  assert.deepEqual(d.expire(140), [])
  assert.deepEqual(d.expire(150), ['a'])
  assert.deepEqual(d.expire(5000), ['c'])
})

test('decodeEach finds every message boundary, whatever the messages hold', () => {
  const values = [0, -1, -33, 127, 255, 65535, 2 ** 32, -(2 ** 40), 1.5, 'é'.repeat(40),
    'x'.repeat(300), 'y'.repeat(70000), new Uint8Array(300), new Uint8Array(70000), null, true,
    false, [], [[1, [2, [3]]]], { a: { b: [1, { c: 'd' }] } },
    Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`k${i}`, i])),
    Array.from({ length: 20 }, (_, i) => i)]
  const good = values.map((v, i) => [18, i, v])
  const raw = [ // uint 64, float 32, a timestamp (fixext 4), an unknown ext 8
    [0xcf, 0, 0, 0, 0, 0, 0, 0, 1], [0xca, 0x3f, 0xc0, 0, 0], [0xd6, 0xff, 0, 0, 0, 1],
    [0xc7, 3, 5, 1, 2, 3]].map((v, i) => Uint8Array.of(0x93, 18, 100 + i, ...v))
  const bad = Buffer.from(p.encodeMessage([18, 999, { X_proto_X: 1 }]))
  bad.write('__proto__', bad.indexOf('X_proto_X'))
  const parts = [...good.map((m) => p.encodeMessage(m)), ...raw]
  parts.splice(3, 0, bad)
  const frame = Buffer.concat([Uint8Array.of(0xdc, 0, parts.length), ...parts])
  const { msgs, bad: dropped } = p.decodeEach(frame)
  assert.equal(dropped, 1)
  assert.deepEqual(msgs.map((m) => m[1]), [...good.map((m) => m[1]), 100, 101, 102, 103])
  assert.deepEqual(p.decodeEach(Uint8Array.of(0x92, 0x91, 0x12, 0xc1)), { msgs: [[18]], bad: 1 })
  assert.deepEqual(p.decodeEach(bad), { msgs: [], bad: 1 }) // a frame of that one message
})
