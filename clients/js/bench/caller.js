// A load caller through the JS SDK, for benchmarks/sdks.py: the flags and the one JSON line
// at the end of rpcbus.benchmarks.workers' caller, so the harness aggregates both alike.
//   node bench/caller.js --url ws://... --conns 1 --inflight 50 --payload 16 --duration 5
//        --warmup 1 --max-calls N --start-at EPOCH_S --rpc bench.echo [--sample-every 4]
// Each connection keeps --inflight calls going: every answer starts the next call.

import { connect } from '../src/index.js'

const args = { conns: 1, inflight: 50, payload: 16, duration: 5, warmup: 1, 'max-calls': 1e7, 'start-at': 0, rpc: 'bench.echo', 'sample-every': 4 }
const argv = process.argv.slice(2)
for (let i = 0; i < argv.length; i += 2) {
  const key = argv[i].replace(/^--/, '')
  if (!(key in args) && key !== 'url') throw new Error(`unknown option ${argv[i]}`)
  args[key] = key === 'url' || key === 'rpc' ? argv[i + 1] : Number(argv[i + 1])
}

if (!args.url) {
  console.error('usage: npm run bench -- --url ws://HOST:PORT [--conns 1 --inflight 50 ...] ' +
    '(a node where bench.echo is provided; python -m rpcbus.benchmarks.sdks runs the whole ' +
    'comparison with the Python SDK, starting what it needs)')
  process.exit(2)
}
const clients = []
for (let i = 0; i < args.conns; i++) clients.push(await connect(args.url, { name: 'bench-js-caller' }))
const payload = new Uint8Array(args.payload).map(() => Math.floor(Math.random() * 256))
const rpcs = args.rpc.split(',')
await new Promise((resolve) => setTimeout(resolve, Math.max(0, args['start-at'] * 1000 - Date.now())))
const t0 = performance.now()
const start = t0 + args.warmup * 1000
const end = start + args.duration * 1000
const tally = { measured: 0, total: 0, errors: {}, latencies: [], lastMeasured: start, started: 0 }

async function lane (client) {
  for (;;) {
    const sentAt = performance.now()
    if (sentAt >= end || tally.started >= args['max-calls']) return
    tally.started += 1
    try {
      await client.call(rpcs[tally.started % rpcs.length], payload, { timeout: 10000 })
      const now = performance.now()
      if (now >= start && now < end) {
        tally.measured += 1
        tally.lastMeasured = now
        if (tally.measured % args['sample-every'] === 0) tally.latencies.push(Math.round((now - sentAt) * 1000))
      }
    } catch (err) {
      tally.errors[err.code ?? err.name] = (tally.errors[err.code ?? err.name] ?? 0) + 1
    }
    tally.total += 1
  }
}

await Promise.all(clients.flatMap((c) => Array.from({ length: args.inflight }, () => lane(c))))
const capped = tally.total >= args['max-calls']
process.stdout.write(JSON.stringify({
  measured: tally.measured,
  span: capped ? (tally.lastMeasured - start) / 1000 : args.duration,
  capped,
  total: tally.total,
  errors: tally.errors,
  unanswered: tally.started - tally.total,
  latencies_us: tally.latencies,
  sample_every: args['sample-every'],
}) + '\n')
await Promise.all(clients.map((c) => c.close()))
