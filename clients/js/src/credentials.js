// What a client logs in with, and when it renews a token (clients/credentials.py, point by
// point). `token` may be a string, or a function (sync or async) returning one: it is called
// for every login and, when the token is a JWT with an `exp`, again before it expires; the new
// one goes as AUTH on the live connections (the node keeps the session and gives it the new
// token's rights). A JWT is read here only for `exp` and `iat`; the node checks its signature.

export const RENEW_BEFORE_MS = 60000 // before exp, at the latest
export const RETRY_MS = 5000 // between tries of a renewal that failed

/** A JWT's {exp, iat} in seconds, read without checking it; null when it is not a JWT or has
 * no numeric exp. */
export function jwtTimes (token) {
  const parts = typeof token === 'string' ? token.split('.') : []
  if (parts.length !== 3) return null
  let claims
  try {
    const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/')
    claims = JSON.parse(atob(b64 + '='.repeat((4 - b64.length % 4) % 4)))
  } catch {
    return null
  }
  if (claims === null || typeof claims !== 'object' || typeof claims.exp !== 'number') return null
  return { exp: claims.exp, iat: typeof claims.iat === 'number' ? claims.iat : null }
}

/** ms from `nowMs` (the wall clock) until `token` should be renewed: RENEW_BEFORE_MS before
 * its exp, or a fifth of its life when that is shorter; null when it never needs to be. */
export function renewIn (token, nowMs) {
  const times = jwtTimes(token)
  if (times === null) return null
  const exp = times.exp * 1000
  const from = times.iat !== null && times.iat * 1000 <= nowMs ? times.iat * 1000 : nowMs
  return Math.max(0, exp - Math.min(RENEW_BEFORE_MS, (exp - from) / 5) - nowMs)
}

/** The token to log in with now: the function's answer (awaited), or the string given. */
export async function fetchToken (source) {
  if (typeof source !== 'function') return source
  const token = await source()
  if (typeof token !== 'string' || token === '') {
    throw new TypeError(`the token function returned ${typeof token}, not a token`)
  }
  return token
}
