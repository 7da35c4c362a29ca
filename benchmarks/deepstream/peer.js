// deepstream's own client (@deepstream/client, unchanged), driven line by line by the
// Python tests (tests/deepstream/) and benchmarks: commands come as JSON lines on stdin,
// answers and events go as JSON lines on stdout.
//   {"id": 1, "op": "connect", "url": "ws://.../deepstream", "login": {...}, "options": {...}}
//     answers {"ok": true|false, "data": ...}: login()'s outcome
//   {"id": 1, "op": "login", "login": {...}}: login() again on the same client
//   {"id": 2, "op": "make", "name": "x", "data": ...}: {"ok": result} or {"error": reason}
//   {"id": 3, "op": "provide", "name": "x", "kind": "echo" | "add" | "error" | "reject"
//     | "noaccept" | "late" | "slow" | "leave" | "once"}
//   {"id": 4, "op": "unprovide", "name": "x"}
//   {"id": 5, "op": "snapshot" | "has", "name": "r"}: a record (the node refuses records);
//     {"op": "presence", "users"?: [...]}: presence.getAll() (or getAll(users))
//   {"op": "watch", "user"?: "u"}: presence.subscribe (of everyone, or of one user); each
//     change is printed {"event": "presence", "user", "online", "of": user or null}
//   {"op": "unwatch", "user"?: "u"}: presence.unsubscribe
//   {"op": "subscribe" | "unsubscribe", "name": "e"}: event.subscribe (each event it gets
//     is printed: {"event": "emitted", "name", "data"}) or event.unsubscribe
//   {"op": "emit", "name": "e", "data": ...}: event.emit
//   {"id": 6, "op": "ran"}: how many calls each provided name ran here
//   {"id": 7, "op": "load", "name": "x", "calls": n, "inflight": k, "data": ...}: n makes,
//     k at a time; answers {"ok": {"calls", "errors", "seconds", "firstError"}}
//   {"id": 8, "op": "state"} | {"id": 9, "op": "close"}
// Events: {"event": "state", "state"}, {"event": "error", "error", "kind", "topic"},
// {"event": "reauthenticationFailure", "reason"}.
'use strict'
const { DeepstreamClient } = require('@deepstream/client')
const readline = require('readline')

let client = null
const ran = {}
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

function count (name) { ran[name] = (ran[name] || 0) + 1 }

// an error event's value: a message as the client gives it, or its text when it is no
// plain data (a failed connection's request object)
function plain (value) {
  if (typeof value !== 'object' || value === null) return String(value)
  try { return JSON.parse(JSON.stringify(value)) } catch (e) { return String(value) }
}

const providers = {
  echo: (name) => (data, response) => { count(name); response.send(data === undefined ? null : data) },
  add: (name) => (data, response) => { count(name); response.send(data.a + data.b) },
  error: (name) => (data, response) => { count(name); response.error(data) },
  reject: (name) => (data, response) => { response.reject() },
  // never accepts, never answers: the node ends the call ACCEPT_TIMEOUT
  noaccept: (name) => (data, response) => { count(name); response.autoAccept = false },
  // answers after `data.ms`, without accepting first: a late answer is refused
  late: (name) => (data, response) => {
    count(name)
    response.autoAccept = false
    setTimeout(() => response.send('late'), data.ms)
  },
  slow: (name) => (data, response) => { count(name); setTimeout(() => response.send(data.value), data.ms) },
  // accepts, then its client leaves: the caller's call ends PROVIDER_GONE (RESPONSE_TIMEOUT)
  leave: (name) => (data, response) => {
    count(name)
    response.accept()
    setTimeout(() => process.exit(0), 50)
  }
}

function login (params) {
  return new Promise((resolve) => {
    client.login(params || {}, (ok, data) => resolve({ ok, data: data === undefined ? null : data }))
  })
}

function connect (cmd) {
  client = new DeepstreamClient(cmd.url, cmd.options || {})
  client.on('connectionStateChanged', (state) => out({ event: 'state', state }))
  client.on('error', (error, event, topic) => out({ event: 'error', error: plain(error), kind: event, topic }))
  client.on('reauthenticationFailure', (reason) => out({ event: 'reauthenticationFailure', reason: plain(reason) }))
  return login(cmd.login)
}

async function load (cmd) {
  let next = 0
  let errors = 0
  let firstError = null
  const started = process.hrtime.bigint()
  async function worker () {
    while (next < cmd.calls) {
      next += 1
      try {
        await client.rpc.make(cmd.name, cmd.data === undefined ? null : cmd.data)
      } catch (e) {
        errors += 1
        if (firstError === null) firstError = e
      }
    }
  }
  await Promise.all(Array.from({ length: cmd.inflight }, worker))
  const seconds = Number(process.hrtime.bigint() - started) / 1e9
  return { calls: cmd.calls, errors, seconds, firstError }
}

async function run (cmd) {
  switch (cmd.op) {
    case 'connect': return await connect(cmd)
    case 'login': return await login(cmd.login)
    case 'make': return await client.rpc.make(cmd.name, cmd.data)
    case 'provide': client.rpc.provide(cmd.name, providers[cmd.kind](cmd.name)); return null
    case 'unprovide': client.rpc.unprovide(cmd.name); return null
    case 'snapshot': return await client.record.snapshot(cmd.name)
    case 'has': return await client.record.has(cmd.name)
    case 'presence': return cmd.users ? await client.presence.getAll(cmd.users) : await client.presence.getAll()
    case 'watch':
      if (cmd.user) client.presence.subscribe(cmd.user, (user, online) => out({ event: 'presence', user, online, of: cmd.user }))
      else client.presence.subscribe((user, online) => out({ event: 'presence', user, online, of: null }))
      return null
    case 'unwatch':
      if (cmd.user) client.presence.unsubscribe(cmd.user)
      else client.presence.unsubscribe()
      return null
    case 'subscribe':
      client.event.subscribe(cmd.name, (data) => out({ event: 'emitted', name: cmd.name, data: data === undefined ? null : data }))
      return null
    case 'unsubscribe': client.event.unsubscribe(cmd.name); return null
    case 'emit': client.event.emit(cmd.name, cmd.data); return null
    case 'ran': return ran
    case 'load': return await load(cmd)
    case 'state': return client.getConnectionState()
    case 'close': client.close(); return null
    default: throw new Error(`unknown op ${cmd.op}`)
  }
}

const lines = readline.createInterface({ input: process.stdin })
lines.on('line', (line) => {
  const cmd = JSON.parse(line)
  run(cmd).then(
    (ok) => out({ id: cmd.id, ok: ok === undefined ? null : ok }),
    (err) => out({ id: cmd.id, error: err instanceof Error ? { message: err.message } : err }))
})
lines.on('close', () => { if (client) client.close(); setTimeout(() => process.exit(0), 100) })
