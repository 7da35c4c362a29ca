// deepstream 7 itself (@deepstream/server, from npm), for benchmarks/ds_compare.py: one
// node on 127.0.0.1:<port>, its binary WebSocket endpoint on /deepstream only, no auth,
// no permissions. Prints "started" once it serves; SIGTERM stops it.
'use strict'
const { Deepstream } = require('@deepstream/server')

const port = Number(process.argv[2])
const server = new Deepstream({
  serverName: 'deepstream-bench',
  showLogo: false,
  logLevel: 3, // errors only
  connectionEndpoints: [{ type: 'ws-binary', options: { urlPath: '/deepstream', heartbeatInterval: 30000, outgoingBufferTimeout: 0, maxBufferByteSize: 100000, headers: [], unauthenticatedClientTimeout: 180000, maxAuthAttempts: 3, logInvalidAuthData: false, maxMessageSize: 1048576 } }],
  httpServer: { type: 'default', options: { host: '127.0.0.1', port, healthCheckPath: '/health-check', allowAllOrigins: true, origins: [], headers: [], maxMessageSize: 1048576 } },
  telemetry: { type: 'deepstreamIO', options: { enabled: false } }
})
server.on('started', () => process.stdout.write('started\n'))
server.start()
process.on('SIGTERM', () => { server.on('stopped', () => process.exit(0)); server.stop() })
