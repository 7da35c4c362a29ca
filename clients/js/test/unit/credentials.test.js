import { test } from 'node:test'
import assert from 'node:assert/strict'
import { fetchToken, jwtTimes, renewIn, RENEW_BEFORE_MS } from '../../src/credentials.js'

const b64url = (obj) => Buffer.from(JSON.stringify(obj)).toString('base64url')
const jwt = (claims) => `${b64url({ alg: 'EdDSA' })}.${b64url(claims)}.sig`

test('a JWT is renewed a minute before it expires, or a fifth of its life when shorter', () => {
  const now = 1_000_000_000
  assert.equal(renewIn(jwt({ iat: now / 1000, exp: now / 1000 + 3600 }), now), 3600_000 - RENEW_BEFORE_MS)
  assert.equal(renewIn(jwt({ iat: now / 1000, exp: now / 1000 + 10 }), now), 8000)
  assert.equal(renewIn(jwt({ exp: now / 1000 + 10 }), now), 8000) // no iat: from now
  assert.equal(renewIn(jwt({ exp: now / 1000 - 5 }), now), 0) // expired: at once
  assert.equal(renewIn('a-static-token', now), null)
  assert.equal(renewIn(jwt({ sub: 'no exp' }), now), null)
  assert.equal(jwtTimes('x.not base64!.y'), null)
})

test('a token function is awaited, and must return a token', async () => {
  assert.equal(await fetchToken('plain'), 'plain')
  assert.equal(await fetchToken(async () => 't2'), 't2')
  await assert.rejects(fetchToken(() => 42), /returned number, not a token/)
})
