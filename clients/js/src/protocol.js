// The client wire protocol (docs/protocol.md, version 1): message kinds, the frame codec and
// batching. Pure: no I/O. A binary WebSocket frame holds msgpack: one message, or an array
// of messages; a message is an array whose first element is its kind.

import { Decoder, Encoder } from '@msgpack/msgpack'

export const PROTOCOL_VERSION = 1

export const AUTH = 1
export const AUTH_OK = 2
export const AUTH_FAIL = 3
export const PROVIDE = 4
export const UNPROVIDE = 5
export const OK = 6
export const REQUEST = 16
export const ACCEPT = 17
export const RESPONSE = 18
export const REJECT = 19
export const ERROR = 20
export const CANCEL = 21
export const ACCEPT_UPTO = 22 // [22, id]: every REQUEST up to id not REJECTed is accepted
export const STREAM = 23 // a REQUEST answered in parts, with a credit window
export const PART = 24 // one part of a stream's answer (RESPONSE, data nil, ends it)
export const CREDIT = 25 // [25, id, read]: the caller has read this many parts in all
export const ALL = 26 // call_all: ask every provider of a name
export const REPLY = 27 // [27, cid, provider, node, data, [code, message, detail?]?]
export const DISCOVER = 28 // [28, ref, name or nil]: what the cluster provides
export const FOUND = 29 // [29, ref, what]: DISCOVER's answer
export const PING = 30
export const PONG = 31
// events (docs/events.md)
export const SUBSCRIBE = 32 // [32, ref, [topic, ...]], answered by OK (once the cluster hears them)
export const UNSUBSCRIBE = 33 // [33, ref, [topic, ...]], answered by OK
export const EMIT = 34 // [34, topic, data]: no answer (at most once)
export const EVENT = 35 // [35, topic, data]: an event of a subscribed topic
export const GAP = 36 // [36, topic or nil, count or nil]: events lost for this client
// presence: who is logged in across the cluster
export const PRESENCE_GET = 37 // [37, ref, [user, ...] or nil], answered by FOUND
export const PRESENCE_SUBSCRIBE = 38 // [38, ref, [user, ...] or nil], answered by OK
export const PRESENCE_UNSUBSCRIBE = 39 // [39, ref, [user, ...] or nil], answered by OK
export const PRESENCE = 40 // [40, user, online]: a user came online anywhere, or left everywhere
export const SENT = 41 // [41, ms]: the frame's first call was made at ms (its clock); the node counts its wait

/** Most messages in one frame unless the node says fewer (AUTH_OK max_frame_messages). */
export const MAX_FRAME_MESSAGES = 10000
export const MAX_NAME = 128
const NAME = /^(?:[A-Za-z0-9_]|%[0-9A-F]{2})(?:[A-Za-z0-9_.:/-]|%[0-9A-F]{2})*$/

/** True for a usable rpc name: 1-128 of A-Z a-z 0-9 _ . : / -, not starting with . : / - */
export function validName (name, maxLength = MAX_NAME) {
  return typeof name === 'string' && name.length > 0 && name.length <= maxLength && NAME.test(name)
}

/** A frame that does not follow the protocol; the message says why. */
export class ProtocolError extends Error {
  constructor (message) { super(message); this.name = 'ProtocolError' }
}

// ignoreUndefined: `{a: undefined}` travels as `{}`, as JSON.stringify would have it.
// maxDepth 1024: as deep as the Python side packs (the node refuses what its bus cannot carry).
const encoder = new Encoder({ ignoreUndefined: true, maxDepth: 1024 })
const decoder = new Decoder()

/** One message as msgpack bytes; throws when the data holds what msgpack cannot carry. */
export function encodeMessage (msg) {
  return encoder.encode(msg)
}

function arrayHeader (n) {
  if (n < 16) return Uint8Array.of(0x90 | n)
  if (n < 0x10000) return Uint8Array.of(0xdc, n >> 8, n & 0xff)
  return Uint8Array.of(0xdd, (n >>> 24) & 0xff, (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff)
}

function join (group, size) {
  if (group.length === 1) return group[0]
  const head = arrayHeader(group.length)
  const out = new Uint8Array(head.length + size)
  out.set(head, 0)
  let at = head.length
  for (const part of group) { out.set(part, at); at += part.length }
  return out
}

/**
 * Group packed messages into frames of at most `maxFrame` bytes and `maxMessages`
 * messages: a frame of one message is that message, several make a msgpack array. A
 * single message over `maxFrame` still goes alone (the caller decides whether to send it).
 * `head`, when given, begins every frame (a SENT: the node times each frame's calls from
 * its own, and takes a frame without one as not having waited).
 */
export function packInFrames (parts, maxFrame, maxMessages = MAX_FRAME_MESSAGES, head = null) {
  if (head && maxMessages < 2) { // no room for it beside a message: once, as one
    parts = [head, ...parts]
    head = null
  }
  const first = head ? [head] : []
  const frames = []
  let group = [...first]
  let size = head ? head.length : 0
  for (const part of parts) {
    if (group.length > first.length &&
        (size + part.length + 5 > maxFrame || group.length >= maxMessages)) {
      frames.push(join(group, size))
      group = [...first]
      size = head ? head.length : 0
    }
    group.push(part)
    size += part.length
  }
  if (group.length > first.length) frames.push(join(group, size))
  return frames
}

/**
 * The messages of one frame. Throws ProtocolError for anything that is not msgpack, or
 * not a message (an array starting with an integer kind) or a non-empty array of them.
 */
export function decodeFrame (data) {
  let obj
  try {
    obj = decoder.decode(data instanceof ArrayBuffer ? new Uint8Array(data) : data)
  } catch (err) {
    throw new ProtocolError(`frame is not valid msgpack (${err && err.name})`)
  }
  if (!Array.isArray(obj) || obj.length === 0) {
    throw new ProtocolError('frame must be a message or a non-empty array of messages')
  }
  if (Number.isInteger(obj[0])) return [obj]
  for (const msg of obj) {
    if (!Array.isArray(msg) || msg.length === 0 || !Number.isInteger(msg[0])) {
      throw new ProtocolError('every message must be an array starting with its kind')
    }
  }
  return obj
}

/**
 * The messages of one frame that decode, and how many did not: `{ msgs, bad }`. One bad
 * message (a `__proto__` map key, which the decoder refuses; bytes that are not msgpack)
 * costs only itself, never the others the node batched with it. The whole frame is
 * decoded at once first; only a frame that fails is taken apart message by message.
 */
export function decodeEach (data) {
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : data
  try {
    return { msgs: decodeFrame(bytes), bad: 0 }
  } catch (err) {
    if (!(err instanceof ProtocolError)) throw err
  }
  let count, pos
  const first = bytes[0]
  if (first >= 0x90 && first <= 0x9f) [count, pos] = [first & 0x0f, 1]
  else if (first === 0xdc && bytes.length >= 3) [count, pos] = [(bytes[1] << 8) | bytes[2], 3]
  else if (first === 0xdd && bytes.length >= 5) {
    [count, pos] = [new DataView(bytes.buffer, bytes.byteOffset).getUint32(1), 5]
  } else return { msgs: [], bad: 1 }
  const lead = bytes[pos]
  if (!(lead >= 0x90 && lead <= 0x9f) && lead !== 0xdc && lead !== 0xdd) {
    return { msgs: [], bad: 1 } // a frame of one message: its first field is its kind
  }
  const msgs = []
  for (let i = 0; i < count; i++) {
    let end
    try {
      end = skipObject(bytes, pos)
    } catch {
      return { msgs, bad: count - i } // no message boundary after this: the rest is lost
    }
    let msg
    try {
      msg = decoder.decode(bytes.subarray(pos, end))
    } catch {
      msg = null // this message only
    }
    if (Array.isArray(msg) && msg.length > 0 && Number.isInteger(msg[0])) msgs.push(msg)
    pos = end
  }
  return { msgs, bad: count - msgs.length }
}

// Bytes that follow a msgpack type byte before the next object: [fixed bytes, length bytes]
// (a length of that many bytes follows, then the body), by type byte 0xc4-0xdb.
const FOLLOWING = {
  0xc4: [0, 1], 0xc5: [0, 2], 0xc6: [0, 4], 0xc7: [1, 1], 0xc8: [1, 2], 0xc9: [1, 4],
  0xca: [4, 0], 0xcb: [8, 0], 0xcc: [1, 0], 0xcd: [2, 0], 0xce: [4, 0], 0xcf: [8, 0],
  0xd0: [1, 0], 0xd1: [2, 0], 0xd2: [4, 0], 0xd3: [8, 0], 0xd4: [2, 0], 0xd5: [3, 0],
  0xd6: [5, 0], 0xd7: [9, 0], 0xd8: [17, 0], 0xd9: [0, 1], 0xda: [0, 2], 0xdb: [0, 4]
}

/** Where the msgpack object at `pos` ends, without building it; throws on bad bytes. */
function skipObject (bytes, pos) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const size = (at, n) => n === 1 ? view.getUint8(at) : n === 2 ? view.getUint16(at) : view.getUint32(at)
  let objects = 1 // still to skip; containers add their elements (no recursion)
  while (objects-- > 0) {
    if (pos >= bytes.length) throw new RangeError('truncated')
    const b = bytes[pos++]
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) continue
    if (b <= 0x8f) objects += 2 * (b & 0x0f)
    else if (b <= 0x9f) objects += b & 0x0f
    else if (b <= 0xbf) pos += b & 0x1f
    else if (b >= 0xdc && b <= 0xdf) { // array 16/32, map 16/32
      const n = b === 0xdc || b === 0xde ? 2 : 4
      objects += (b >= 0xde ? 2 : 1) * size(pos, n)
      pos += n
    } else if (FOLLOWING[b]) {
      const [fixed, lengthBytes] = FOLLOWING[b]
      pos += lengthBytes ? lengthBytes + size(pos, lengthBytes) + fixed : fixed
    } else throw new RangeError('not msgpack') // 0xc1
  }
  if (pos > bytes.length) throw new RangeError('truncated')
  return pos
}
