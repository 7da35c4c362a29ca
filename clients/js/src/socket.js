// The WebSocket class to use: the one given, the platform's (browsers, Node.js 22+), or
// the `ws` package (Node.js 18 and 20). Imported lazily, so a page never loads `ws`.

/** `{ WebSocket, node }`: the class, and whether it is the `ws` package (which takes
 * options such as `ca` and hands frames over as Buffers). `given` wins. */
export async function webSocketClass (given) {
  if (given) return { WebSocket: given, node: false }
  if (typeof globalThis.WebSocket === 'function') return { WebSocket: globalThis.WebSocket, node: false }
  const mod = await import('ws')
  return { WebSocket: mod.WebSocket || mod.default, node: true }
}
