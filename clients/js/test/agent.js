// A JS client driven line by line, for the Python integration tests (tests/js/): commands
// come as JSON lines on stdin, results and events go as JSON lines on stdout.
//   {"id": 1, "op": "connect", "urls": [...], "options": {...}}
//   {"id": 2, "op": "call", "name": "x", "data": ..., "timeout": ms, "abortAfter": ms}
//   {"id": 3, "op": "provide", "name": "js.echo", "kind": "echo" | "hang" | "throw" | "reject" | "apperror"
//                                                  | "count" | "fails" | "endless"}
//   {"id": 5, "op": "stream", "name": "x", "data": ..., "timeout": ms, "window": n, "take": n,
//    "abortAfter": ms}: the parts read (up to `take`, then break) and the error, if any
//   {"id": 6, "op": "yielded"}: parts the "endless" handlers made so far
//   {"id": 7, "op": "callAll", "name": "x", "data": ..., "timeout": ms, "maxReplies": n}: the
//    replies, each {provider, node, ok: true, value} or {provider, node, ok: false, error: {...}}
//   {"id": 8, "op": "subscribe" | "unsubscribe", "topic": "t"}: each event it gets is printed,
//    {"event": "emitted", "topic", "data"}, each gap {"event": "gap", "topic", "count"}
//   {"id": 9, "op": "emit", "topic": "t", "data": ...}
//   {"id": 10, "op": "presence" | "watchPresence" | "unwatchPresence", "users"?: [...]}: each
//    change watched is printed {"event": "presence", "user", "online"}
//   {"id": 4, "op": "close" | "drain"}
// Answers: {"id": 1, "ok": value} or {"id": 1, "error": {"code", "name", "message", "data"}};
// events: {"event": "state", "state": ...}, {"event": "aborted", "rpc": ...}.

import { createInterface } from 'node:readline'
import { AppError, connect, RpcError, Reject } from '../src/index.js'

let client = null
let yielded = 0
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')
const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

const handlers = {
  echo: (data, ctx) => ({ data, rpc: ctx.rpc, caller: ctx.caller, user: ctx.user, timeLeft: ctx.timeLeft, traceparent: ctx.traceparent }),
  hang: (data, ctx) => new Promise((resolve) => {
    ctx.signal.addEventListener('abort', () => { out({ event: 'aborted', rpc: ctx.rpc, reason: ctx.signal.reason.name }); resolve(null) })
  }),
  throw: () => { throw new Error('js handler failed') },
  reject: () => { throw new Reject() },
  apperror: (data) => { throw new AppError('OUT_OF_STOCK', 'none left', { sku: data, left: 0 }) },
  count: async function * (n) { for (let i = 0; i < n; i++) yield { i } },
  fails: function * () { yield 1; yield 2; throw new AppError('RAN_DRY', 'no more', { after: 2 }) },
  endless: async function * (data, ctx) {
    try {
      for (;;) { yielded += 1; yield yielded; await wait(0) }
    } finally {
      out({ event: 'closed', rpc: ctx.rpc, aborted: ctx.signal.aborted })
    }
  }
}

async function stream (cmd) {
  const options = { timeout: cmd.timeout, window: cmd.window }
  if (cmd.abortAfter !== undefined) {
    const ac = new AbortController()
    setTimeout(() => ac.abort(), cmd.abortAfter)
    options.signal = ac.signal
  }
  const parts = []
  try {
    for await (const part of client.stream(cmd.name, cmd.data ?? null, options)) {
      parts.push(part)
      if (cmd.take !== undefined && parts.length >= cmd.take) break
      if (cmd.every !== undefined) await wait(cmd.every)
    }
    return { parts, error: null }
  } catch (err) {
    return { parts, error: { code: err instanceof RpcError ? err.code : null, name: err.name, message: err.message, data: err.data ?? null } }
  }
}

async function run (cmd) {
  switch (cmd.op) {
    case 'connect':
      if (cmd.tokens) { // a token function: each login and renewal takes the next
        const tokens = [...cmd.tokens]
        cmd.options = { ...cmd.options, token: async () => tokens.length > 1 ? tokens.shift() : tokens[0] }
      }
      client = await connect(cmd.urls, { ...cmd.options, onState: (state) => out({ event: 'state', state, url: client ? client.url : null }) })
      return { url: client.url, user: client.session.user, node: client.session.node }
    case 'call': {
      const options = { timeout: cmd.timeout, idempotent: cmd.idempotent }
      if (cmd.abortAfter !== undefined) {
        const ac = new AbortController()
        setTimeout(() => ac.abort(), cmd.abortAfter)
        options.signal = ac.signal
      }
      return await client.call(cmd.name, cmd.data ?? null, options)
    }
    case 'provide': return await client.provide(cmd.name, handlers[cmd.kind]) ?? null
    case 'stream': return await stream(cmd)
    case 'yielded': return yielded
    case 'rpcs': return await client.rpcs()
    case 'providers': return await client.providers(cmd.name)
    case 'callAll': {
      const replies = await client.callAll(cmd.name, cmd.data ?? null, { timeout: cmd.timeout, maxReplies: cmd.maxReplies })
      return replies.map((r) => r.ok
        ? { provider: r.provider, node: r.node, ok: true, value: r.value }
        : { provider: r.provider, node: r.node, ok: false, error: { code: r.error.code, name: r.error.name, message: r.error.message, data: r.error.data ?? null } })
    }
    case 'unprovide': return await client.unprovide(cmd.name) ?? null
    case 'subscribe':
      return await client.subscribe(cmd.topic, (data) => out({ event: 'emitted', topic: cmd.topic, data }),
        { onGap: (topic, count) => out({ event: 'gap', topic, count }) }) ?? null
    case 'unsubscribe': return await client.unsubscribe(cmd.topic) ?? null
    case 'emit': return await client.emit(cmd.topic, cmd.data ?? null) ?? null
    case 'presence': return await client.presence(cmd.users ?? null)
    case 'watchPresence':
      return await client.watchPresence((user, online) => out({ event: 'presence', user, online }), cmd.users ?? null) ?? null
    case 'unwatchPresence': return await client.unwatchPresence(cmd.users ?? null) ?? null
    case 'sleep': await wait(cmd.ms); return null
    case 'drain': await client.drain(cmd.timeout); return client.state
    case 'close': await client.close(); return client.state
    default: throw new Error(`unknown op ${cmd.op}`)
  }
}

const lines = createInterface({ input: process.stdin })
lines.on('line', (line) => {
  const cmd = JSON.parse(line)
  run(cmd).then(
    (ok) => out({ id: cmd.id, ok: ok ?? null }),
    (err) => out({ id: cmd.id, error: { code: err instanceof RpcError ? err.code : null, name: err.name, message: err.message, data: err.data ?? null } }))
})
lines.on('close', () => { if (client) client.close() })
