// Benchmark-only floor of a NIP-77 reconciliation with nostr-tools' client: its Negentropy
// initiator against nostr-tools' own responder in the same process, no socket, no relay.
// What is left is the client's own work (and the reference responder's): the wall time a
// relay of zero cost would give this client.
//
//   node bench/js/neg_inprocess.mjs CLIENT_ITEMS.bin RELAY_ITEMS.bin CLIENT_FRAME RELAY_FRAME OUT.json
//
// Items files: 36-byte records, uint32 LE created_at + 32-byte id (as neg_client.mjs).
// Writes one JSON object: rounds, initiator_ms, responder_ms, wall_ms (both, from
// initiate() to the last reconcile() returning null), have and need (hex ids).
import { readFileSync, writeFileSync } from 'node:fs'
import { performance } from 'node:perf_hooks'
import { nip77 } from 'nostr-tools'

const [clientPath, relayPath, clientFrame, relayFrame, outPath] = process.argv.slice(2)

function load(path) {
  const buf = readFileSync(path)
  const storage = new nip77.NegentropyStorageVector()
  for (let off = 0; off + 36 <= buf.length; off += 36) {
    storage.insert(buf.readUInt32LE(off), buf.toString('hex', off + 4, off + 36))
  }
  storage.seal()
  return storage
}

const initiator = new nip77.Negentropy(load(clientPath), Number(clientFrame))
const responder = new nip77.Negentropy(load(relayPath), Number(relayFrame))
const out = { rounds: 0, initiator_ms: 0, responder_ms: 0, have: [], need: [] }
const t0 = performance.now()
let msg = initiator.initiate()
out.initiator_ms += performance.now() - t0
while (msg !== null && msg !== undefined) {
  const r0 = performance.now()
  const reply = responder.reconcile(msg)
  const r1 = performance.now()
  msg = initiator.reconcile(reply, id => out.have.push(id), id => out.need.push(id))
  out.initiator_ms += performance.now() - r1
  out.responder_ms += r1 - r0
  out.rounds += 1
}
out.wall_ms = performance.now() - t0
writeFileSync(outPath, JSON.stringify(out))
