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
export const PING = 30
export const PONG = 31

/** Most messages in one frame unless the node says fewer (AUTH_OK max_frame_messages). */
export const MAX_FRAME_MESSAGES = 10000
export const MAX_NAME = 128
const NAME = /^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$/

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
 */
export function packInFrames (parts, maxFrame, maxMessages = MAX_FRAME_MESSAGES) {
  const frames = []
  let group = []
  let size = 0
  for (const part of parts) {
    if (group.length && (size + part.length + 5 > maxFrame || group.length >= maxMessages)) {
      frames.push(join(group, size))
      group = []
      size = 0
    }
    group.push(part)
    size += part.length
  }
  if (group.length) frames.push(join(group, size))
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
