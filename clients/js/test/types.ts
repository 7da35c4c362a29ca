// Compiled by `npm test` (tsc, no output): the shipped types fit the README's example,
// and misuse is a type error.
import { AppError, connect, RpcError, Reject, NoProviderError, type CallContext, type Client } from '../src/index.js'

export async function example (signal: AbortSignal): Promise<number> {
  const c: Client = await connect(['ws://127.0.0.1:6021', 'ws://127.0.0.1:6022'], { name: 'web', user: 'u', password: 'p', onState: (s) => { if (s === 'closed') return } })
  await c.provide('math.add', async (data: { a: number, b: number }, ctx: CallContext) => {
    if (ctx.timeLeft < 10 || ctx.signal.aborted) throw new Reject()
    if (data.a < 0) throw new AppError('NEGATIVE', 'a must be >= 0', { a: data.a })
    return data.a + data.b
  })
  const r = await c.call<number>('math.add', { a: 1, b: 2 }, { timeout: 5000, signal })
  try {
    await c.call('nobody', null)
  } catch (e) {
    if (e instanceof RpcError && e.code === 'NO_PROVIDER' && e instanceof NoProviderError) return -1
    if (e instanceof AppError) return e.data === null ? -2 : -3
  }
  // @ts-expect-error: a timeout is a number of milliseconds
  await c.call('math.add', {}, { timeout: '5s' })
  await c.drain(1000)
  await c.close()
  return r
}

export async function found (c: Client): Promise<number[]> {
  const names: string[] = (await c.rpcs()).map((r) => r.rpc)
  // @ts-expect-error: the name is `rpc`
  names.push((await c.rpcs())[0].name)
  const replies = await c.callAll<number>('math.add', { a: 1, b: 2 })
  return replies.map((r) => r.ok ? r.value : r.error.code.length) // narrowed by `ok`
}

export async function events (c: Client): Promise<number> {
  const seen: string[] = []
  await c.subscribe<{ text: string }>('chat.room1', (data) => { seen.push(data.text) },
    { onGap: (topic, count) => { seen.push(`${topic} lost ${count ?? 'some'}`) } })
  await c.emit('chat.room1', { text: 'hi' })
  // @ts-expect-error: a topic is a string
  await c.emit(7, null)
  await c.unsubscribe('chat.room1')
  const online: string[] = await c.presence()
  const some: Record<string, boolean> = await c.presence(['ann'])
  await c.watchPresence((user, on) => { seen.push(`${user} ${on ? 'in' : 'out'}`) }, ['ann'])
  await c.unwatchPresence()
  return c.eventsLost + seen.length + online.length + Object.keys(some).length
}
