// Test-only driver: one NIP-50 search REQ with nostr-tools' Relay, so the
// Python tests can compare what an independent client receives.
//
//   node --experimental-websocket search_driver.mjs <relay url> '<filter JSON>'
//
// Prints one JSON line: {"ids":[...]} in the order received before EOSE, or
// {"closed":"reason"}; exits 1 with the error on stderr otherwise.
import { Relay } from 'nostr-tools/relay'

const [url, filterJson] = process.argv.slice(2)
const relay = await Relay.connect(url)
const ids = []
const answer = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(Error('no EOSE within 10 s')), 10000)
  relay.subscribe([JSON.parse(filterJson)], {
    onevent(event) { ids.push(event.id) },
    oneose() { clearTimeout(timer); resolve({ ids }) },
    onclose(reason) { clearTimeout(timer); resolve({ closed: reason }) },
  })
})
console.log(JSON.stringify(answer)) // once: closing the relay below calls onclose again
relay.close()
