// Test-only driver: runs the nostr-tools NIP-77 engine (Negentropy,
// NegentropyStorageVector) so the Python tests can compare messages byte for
// byte.  Protocol: one JSON request per line on stdin, one JSON reply per line
// on stdout, in order.
//
//   {"op":"new","h":"a","frame":4096,"items":[[ts,"idhex"],...]} -> {"size":n}
//   {"op":"initiate","h":"a"}                -> {"msg":"hex"}
//   {"op":"reconcile","h":"a","msg":"hex"}   -> {"msg":"hex"|null,"have":[hex],"need":[hex]}
//   {"op":"free","h":"a"}                    -> {}
//
// Any exception becomes {"error":"message"}.
import { createInterface } from 'node:readline'
import { nip77 } from 'nostr-tools'

const sessions = new Map()

function session(h) {
  const neg = sessions.get(h)
  if (!neg) throw Error(`no session ${h}`)
  return neg
}

const ops = {
  new({ h, frame, items }) {
    const storage = new nip77.NegentropyStorageVector()
    for (const [ts, id] of items) storage.insert(ts, id)
    storage.seal()
    sessions.set(h, new nip77.Negentropy(storage, frame))
    return { size: storage.size() }
  },
  initiate({ h }) {
    return { msg: session(h).initiate() }
  },
  reconcile({ h, msg }) {
    const have = []
    const need = []
    const out = session(h).reconcile(msg, id => have.push(id), id => need.push(id))
    return { msg: out, have, need }
  },
  free({ h }) {
    sessions.delete(h)
    return {}
  },
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity })
rl.on('line', line => {
  let reply
  try {
    const req = JSON.parse(line)
    const op = ops[req.op]
    if (!op) throw Error(`unknown op ${req.op}`)
    reply = op(req)
  } catch (err) {
    reply = { error: String(err && err.message ? err.message : err) }
  }
  process.stdout.write(JSON.stringify(reply) + '\n')
})
