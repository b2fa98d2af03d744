// Benchmark-only NIP-77 client: nostr-tools' Negentropy (the initiator) holding the
// client-side items, speaking NEG-OPEN / NEG-MSG to a relay over Node's built-in
// WebSocket (Node 20: run with --experimental-websocket).
//
//   node --experimental-websocket bench/js/neg_client.mjs URL ITEMS.bin FRAME PIDS OUT.json
//
// ITEMS.bin: 36-byte records, uint32 LE created_at + 32-byte id.  PIDS: comma-separated
// pids of the relay's process tree; their utime+stime (/proc/PID/stat) is read right
// before each send and right after each receive, so every round gets the relay CPU
// spent between our message and its answer.  Writes one JSON object to OUT.json.
import { readFileSync, writeFileSync } from 'node:fs'
import { performance } from 'node:perf_hooks'
import { nip77 } from 'nostr-tools'

const [url, itemsPath, frameArg, pidsArg, outPath] = process.argv.slice(2)
const frame = Number(frameArg)
const pids = pidsArg ? pidsArg.split(',').filter(Boolean).map(Number) : []
const CLK_TCK = 100
const TIMEOUT_MS = Number(process.env.NEG_TIMEOUT_MS || 600000)

function relayCpu() {
  let ticks = 0
  for (const pid of pids) {
    try {
      const s = readFileSync(`/proc/${pid}/stat`, 'latin1')
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ')
      ticks += Number(f[11]) + Number(f[12])
    } catch { /* gone */ }
  }
  return ticks / CLK_TCK
}

const t0 = performance.now()
const buf = readFileSync(itemsPath)
const storage = new nip77.NegentropyStorageVector()
for (let off = 0; off + 36 <= buf.length; off += 36) {
  storage.insert(buf.readUInt32LE(off), buf.toString('hex', off + 4, off + 36))
}
storage.seal()
const buildMs = performance.now() - t0

const out = { items: storage.size(), frame, build_ms: buildMs, rounds: [], have: [], need: [],
              errors: [], notices: [] }

const ws = new WebSocket(url)
const timer = setTimeout(() => { out.errors.push(`timeout after ${TIMEOUT_MS} ms`); finish() }, TIMEOUT_MS)
let finished = false
function finish() {
  if (finished) return
  finished = true
  clearTimeout(timer)
  out.relay_cpu_total_s = relayCpu() - out.relay_cpu_start_s
  try { ws.close() } catch { }
  writeFileSync(outPath, JSON.stringify(out))
  setTimeout(() => process.exit(0), 50)
}

let neg, tStart, sendAt, cpuAtSend, sentBytes, clientMs = 0
function send(text) {
  sentBytes = text.length
  cpuAtSend = relayCpu()
  sendAt = performance.now()
  ws.send(text)
}

ws.onerror = ev => { out.errors.push(`websocket error: ${ev.message || ev.type}`); finish() }
ws.onclose = ev => { if (!finished) { out.errors.push(`closed ${ev.code} ${ev.reason}`); finish() } }
ws.onopen = () => {
  neg = new nip77.Negentropy(storage, frame)
  out.relay_cpu_start_s = relayCpu()
  tStart = performance.now()
  const c0 = performance.now()
  const msg = neg.initiate()
  clientMs += performance.now() - c0
  send(JSON.stringify(['NEG-OPEN', 'bench', {}, msg]))
}
ws.onmessage = ev => {
  const recvAt = performance.now()
  const cpu = relayCpu()
  const text = typeof ev.data === 'string' ? ev.data : Buffer.from(ev.data).toString()
  let data
  try { data = JSON.parse(text) } catch (e) { out.errors.push(`bad JSON: ${e}`); return finish() }
  if (data[0] === 'NOTICE') { out.notices.push(data[1]); return }
  if (data[0] === 'NEG-ERR') { out.errors.push(`NEG-ERR ${data[2]}`); return finish() }
  if (data[0] !== 'NEG-MSG' || data[1] !== 'bench') { out.notices.push(text.slice(0, 200)); return }
  const round = { up_bytes: sentBytes, down_bytes: text.length, rtt_ms: recvAt - sendAt,
                  relay_cpu_s: cpu - cpuAtSend }
  const c0 = performance.now()
  let next
  try {
    next = neg.reconcile(data[2], id => out.have.push(id), id => out.need.push(id))
  } catch (e) { out.errors.push(`reconcile: ${e}`); return finish() }
  round.client_ms = performance.now() - c0
  clientMs += round.client_ms
  out.rounds.push(round)
  if (next === null || next === undefined) {
    out.wall_ms = performance.now() - tStart
    out.client_ms = clientMs
    ws.send(JSON.stringify(['NEG-CLOSE', 'bench']))
    return finish()
  }
  if (out.rounds.length > 10000) { out.errors.push('more than 10000 rounds'); return finish() }
  send(JSON.stringify(['NEG-MSG', 'bench', next]))
}
