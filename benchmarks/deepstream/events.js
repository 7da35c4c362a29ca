// deepstream's own client (@deepstream/client, unchanged) for `rpcbus bench events`
// (benchmarks/events.py), as its Python workers do it for rpcbus and NATS:
//   node events.js subs URL CONNS DURATION PAYLOAD BATCH: CONNS clients subscribe to the
//     topic; prints {"ready": true}, then on a stdin line {"got", "lost": 0, "sample"}
//   node events.js pub URL 1 DURATION PAYLOAD BATCH: emits for DURATION s, a presence
//     query (a round trip) after each BATCH emits; prints {"sent", "seconds"}
// Each event's data is [seq, the publisher's monotonic clock in µs, payload].
'use strict'
const { DeepstreamClient } = require('@deepstream/client')
const readline = require('readline')

const TOPIC = 'bench.events'
const SAMPLE = 20000
const [role, url, conns, duration, payloadBytes, batch] = process.argv.slice(2)
const nowUs = () => Number(process.hrtime.bigint() / 1000n)
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

function connect () {
  return new Promise((resolve, reject) => {
    const client = new DeepstreamClient(url, { subscriptionInterval: 0 })
    client.on('error', (error, event) => process.stderr.write(`${event}: ${error}\n`))
    client.login({}, (ok) => ok ? resolve(client) : reject(new Error('login refused')))
  })
}

async function subs () {
  let got = 0
  const sample = []
  const clients = []
  for (let i = 0; i < Number(conns); i++) {
    const client = await connect()
    client.event.subscribe(TOPIC, (data) => {
      got += 1
      const late = nowUs() - data[1]
      if (sample.length < SAMPLE) sample.push(late)
      else {
        const j = Math.floor(Math.random() * got)
        if (j < SAMPLE) sample[j] = late
      }
    })
    clients.push(client)
  }
  await clients[0].presence.getAll() // the subscriptions have left (the client sends them first)
  out({ ready: true })
  readline.createInterface({ input: process.stdin }).once('line', () => {
    out({ got, lost: 0, gaps: 0, sample })
    for (const c of clients) c.close()
    setTimeout(() => process.exit(0), 100)
  })
}

async function pub () {
  const client = await connect()
  const payload = 'x'.repeat(Number(payloadBytes))
  let sent = 0
  const started = performance.now()
  const end = started + Number(duration) * 1000
  while (performance.now() < end) {
    for (let i = 0; i < Number(batch); i++) {
      client.event.emit(TOPIC, [sent, nowUs(), payload])
      sent += 1
    }
    await client.presence.getAll() // the server has read the batch
  }
  out({ sent, seconds: (performance.now() - started) / 1000 })
  client.close()
  setTimeout(() => process.exit(0), 100)
}

(role === 'subs' ? subs() : pub()).catch((err) => { process.stderr.write(`${err}\n`); process.exit(1) })
