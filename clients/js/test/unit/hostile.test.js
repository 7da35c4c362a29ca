// A node that sends garbage, over a real WebSocket (the `ws` package's server on a free
// loopback port): the client drops what it cannot use, keeps its calls, never throws.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { decode, encode } from '@msgpack/msgpack'
import { WebSocketServer } from 'ws'
import { connect } from '../../src/index.js'

test('bad frames and messages from a node break nothing', async () => {
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await new Promise((resolve) => server.on('listening', resolve))
  const warnings = []
  server.on('connection', (ws) => {
    ws.on('message', (data) => {
      const got = decode(data)
      for (const m of Number.isInteger(got[0]) ? [got] : got) {
        if (m[0] === 1) ws.send(encode([2, { node: 'evil', session: 's1', protocol: 1 }]))
        if (m[0] !== 16) continue
        const cid = m[1]
        ws.send('a text frame')
        ws.send(Uint8Array.of(0xc1, 0xff, 0x00)) // not msgpack
        ws.send(encode([])); ws.send(encode({ 16: 1 })); ws.send(encode([[18, cid], 'x']))
        ws.send(encode([[20, cid, 7, { no: 'text' }]])) // an error whose code is no string
        ws.send(encode([[16], [16, 'id', 5], [21, 'zz'], [17], [2, 'again'], [3], [31, { x: 1 }], [99, 1]]))
        ws.send(encode([[18, 12345, 'nobody waits'], [20, 999, 'NO_PROVIDER', 'stray']]))
        const deep = new Uint8Array(5001).fill(0x91) // 5000 arrays of one, around a 1
        deep[5000] = 0x01
        ws.send(Buffer.concat([Buffer.from([0x93, 18, cid + 1]), deep])) // [18, cid+1, [[...]]]
        ws.send(encode([[30, 'ping?'], [18, cid, { fine: true }]]))
      }
    })
  })
  const url = `ws://127.0.0.1:${server.address().port}`
  const c = await connect(url, { logger: { info () {}, warn: (m) => warnings.push(m) } })
  const first = c.call('x', 1, { timeout: 2000 })
  const second = c.call('y', 2, { timeout: 2000 })
  const outcome = await Promise.allSettled([first, second])
  assert.deepEqual(outcome[0], { status: 'fulfilled', value: { fine: true } })
  assert.equal(outcome[1].status, 'fulfilled') // the 5000-deep answer is data: decoded, given
  assert.equal(c.state, 'connected')
  assert.ok(warnings.some((w) => w.startsWith('bad_messages_from_node')), warnings)
  assert.ok(warnings.some((w) => w.startsWith('text_frame_from_node')), warnings)
  await c.close()
  await new Promise((resolve) => server.close(resolve))
})

test('a message the decoder refuses costs only itself, not its frame', async () => {
  const server = new WebSocketServer({ host: '127.0.0.1', port: 0 })
  await new Promise((resolve) => server.on('listening', resolve))
  server.on('connection', (ws) => {
    const cids = []
    ws.on('message', (data) => {
      const got = decode(data)
      for (const m of Number.isInteger(got[0]) ? [got] : got) {
        if (m[0] === 1) ws.send(encode([2, { node: 'evil', session: 's1', protocol: 1 }]))
        if (m[0] === 16) cids.push(m[1])
      }
      if (cids.length < 2) return
      // one frame: an answer whose data holds a __proto__ key, then a plain one
      const frame = Buffer.from(encode([[18, cids[0], { X_proto_X: { polluted: true } }],
        [18, cids[1], 'fine'], [31, 'pong']]))
      const at = frame.indexOf('X_proto_X')
      frame.write('__proto__', at)
      ws.send(frame)
    })
  })
  const url = `ws://127.0.0.1:${server.address().port}`
  const warnings = []
  const c = await connect(url, { logger: { info () {}, warn: (m) => warnings.push(m) } })
  const [first, second] = await Promise.allSettled([
    c.call('x', 1, { timeout: 500 }), c.call('y', 2, { timeout: 3000 })])
  assert.deepEqual(second, { status: 'fulfilled', value: 'fine' })
  assert.equal(first.status, 'rejected') // its answer was dropped: its deadline ends it
  assert.equal(first.reason.code, 'RESPONSE_TIMEOUT')
  assert.equal(c.messagesDropped, 1)
  assert.equal({}.polluted, undefined)
  assert.ok(warnings.some((w) => w.startsWith('bad_messages_from_node') && w.includes('kept=2')),
    warnings)
  await c.close()
  await new Promise((resolve) => server.close(resolve))
})
