"""Shards across a fleet: convergence time, and the bytes each node receives against a full replica.

    .venv/bin/python bench/fleet.py --seed 1 --nodes 5 --events 5000       # ~1 min
    .venv/bin/python bench/fleet.py --seed 2 --nodes 4 --events 2000 --kinds 1:60,7:30,30023:10 --keep /tmp/fleet

The fleet (docs/peers.md, "Shards"), relays in this process (tests/inprocess.Relay, configured as
tests/sync/fleet.py configures its nodes: synced every second; claims every `--claim-interval` 1 s,
`--claim-ttl` 4 s, `--clock-skew` 1 s by default, as there), on loopback:

* `archive`: one shard of every event (`filter = {}`);
* `shard1` .. `shard<N-1>`: one shard each, the `--kinds` partitioned among them (the kinds sorted by weight,
  dealt round robin into min(N-1, kinds) shards; with more nodes than kinds, nodes share a shard);
* `replica`: no `[[shards]]`, a full replica of the fleet for comparison: every other node is its
  `[[sync.peers]]` entry with `direction = "down"` (it fetches, shard by shard, and pushes nothing), and no
  node lists it, so it changes nothing the sharded nodes do.  `--no-replica` leaves it out.

Every node of the `archive` and shards lists the others (URL and node pubkey); `[sharding] min_copies` is
`--min-copies` (default 2: an event published to a node outside its shards goes once the archive and a
holder of its shard returned it).

The events: `--events` freshly signed, seeded events (`--seed`, `--authors` keys): kinds drawn by the
`--kinds` weights; kind 1 notes of 5-60 words (half replies), 7 reactions (`e`, `p`, `k`), 6 reposts (the
reposted note's JSON as content), addressable kinds (30000-39999) 150-600 words with a `d` of their own (no
event replaces another), any other regular kind 5-60 words.  created_at within the day before 2026-09-01.
Each is published to a random node of the archive and shards (seeded; never to the replica) over one
WebSocket per node, pipelined; every OK must be true.  Publishing starts once every node holds every claim,
complete, and syncs with each peer by its shards.

What is measured (printed as a table, written to bench/results/fleet-<stamp>.json):

* **converged**: seconds from the last OK until every node holds exactly the events it should: the events of
  its shards (the archive and the replica: all of them), and none other (the events published to a node outside
  its shards were pushed to their holders and removed by the guard).  **held**: seconds until every node held
  at least its shards' events (the removals come after: they wait for the guard's next round and its
  confirmations).  Polled every 0.25 s from each node's database; checked at the end by a REQ to each node.
  After convergence each event is on the archive, on every holder of its kind's shard, and on the replica:
  `copies` is the least and most sharded nodes holding one event.
* **from peers**: events and bytes (`length(raw)`, the canonical JSON) of the bench's events each node
  stored from a peer (`origin` is a peer's URL: fetched by it or pushed to it), read from its `events` table
  after convergence; each event once, whatever the wire carried.  `needed`: the bytes of its shards' events
  that were not published to it, the least it must receive; `/needed` the ratio (1.00: nothing more).
  `/replica`: its bytes from peers over the replica's (which receives every event).  `shard`: the
  bytes of its shards' events over all the events' bytes.
* **wire in**: every byte its WebSocket connections with the other nodes received, both the connections it
  opened (its sync sessions, the guard's REQs) and those its server accepted (the peers' sessions and pushes;
  not the publisher's connections), from the first publish to convergence; `/all` over all the events' bytes,
  `/replica` over the replica's.  The payloads by message type: `push` (an EVENT sent to it), `answer` (an
  EVENT of a subscription of its own: live streams, fetches, the guard's confirmations), `claims` (kind 30803),
  `NEG` (NIP-77), `other` (OK, EOSE, AUTH, ...).  Counted in `websockets`' `Connection.data_received` and
  `process_event`, each connection credited to the node whose start-up made it (a context variable).
  `idle kB/s`: the same before any event, over `--idle` seconds (claims, sessions finding nothing).
* **removed**: events the guard removed on each node (its `shard_events_removed` log lines).  **lapses**: the
  times it found a peer's claims expired (`sync_shards_changed` to no shard): until a new claim, it synced with
  that peer as a full replica, everything both ways.

One event loop runs every node and the publisher: the times include their contention for one process (on a
busy machine, for 2 cores).  Node logs (JSON lines, each with its `node`) go to
bench/results/logs/fleet-<stamp>.log; databases to a temporary directory (`--keep DIR` keeps them there).
"""
from __future__ import annotations

import argparse
import asyncio
import contextvars
import hashlib
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: relay/ and tests/
import structlog  # noqa: E402
import websockets  # noqa: E402
from coincurve import PrivateKey  # noqa: E402
from websockets.asyncio.connection import Connection  # noqa: E402
from websockets.frames import Frame, Opcode  # noqa: E402

from common import RESULTS, write_results  # noqa: E402
from relay.protocol.claims import CLAIM_KIND  # noqa: E402
from tests.conftest import make_config  # noqa: E402
from tests.inprocess import Relay  # noqa: E402
from tests.helpers import Keys  # noqa: E402
from tests.served import free_port  # noqa: E402
from tests.sync.fleet import Node, claim_statuses  # noqa: E402

BASE_TS = 1_788_220_800  # 2026-09-01 00:00 UTC: created_at within the day before
FLEET_WIDE = (5, 62, CLAIM_KIND)
WORDS = ("nostr relay note zap sats bitcoin lightning protocol client key sign event thread reply follow list "
         "pubkey gm coffee build ship code python rust sqlite index query filter shard claim archive replica "
         "today music photo cat dog mountain ocean rain sun moon book read write think idea good maybe why").split()
REACTIONS = ["+", "+", "+", "🤙", "❤️", "-", "⚡"]
WINDOW = 256  # EVENTs in flight per publishing connection
POLL = 0.25  # seconds between two looks at the databases

# ---------------------------------------------------------------- wire bytes, per node
NODE = contextvars.ContextVar("fleet_node", default="")
WIRE: dict[Connection, tuple[str, Counter]] = {}  # connection -> (node, {"wire": bytes, label: payload bytes})
_data_received = Connection.data_received
_process_event = Connection.process_event
NEGENTROPY = {"NEG-OPEN", "NEG-MSG", "NEG-CLOSE", "NEG-ERR"}
CLAIM_TOKEN = f'"kind":{CLAIM_KIND},'.encode()
LABELS = ("push", "answer", "claims", "NEG", "other")


def _counts(conn: Connection) -> Counter:
    entry = WIRE.get(conn)
    if entry is None:
        entry = WIRE[conn] = (NODE.get(), Counter())
    return entry[1]


def _counted(self: Connection, data: bytes) -> None:
    """websockets' `data_received`, counting the bytes for the node whose start-up made this connection."""
    _counts(self)["wire"] += len(data)
    _data_received(self, data)


def _label(payload: bytes) -> str:
    """What a frame's payload is: "claims" (an EVENT of kind 30803), "push" (another EVENT, sent to this
    node: `["EVENT",{...}]`), "answer" (another EVENT this node subscribed to: `["EVENT","<sub>",{...}]`,
    live streams, fetches, the guard's confirmations), "NEG" (NIP-77) or "other" (OK, EOSE, AUTH, REQ...)."""
    head = bytes(payload[:16])
    end = head.find(b'"', 2)
    name = head[2:end].decode(errors="replace") if head.startswith(b'["') and end > 2 else ""
    if name == "EVENT":
        return "claims" if CLAIM_TOKEN in payload else "push" if head[9:10] == b"{" else "answer"
    return "NEG" if name in NEGENTROPY else "other"


def _classified(self: Connection, event) -> None:
    """websockets' `process_event`, counting each data frame's payload bytes by its message type."""
    if isinstance(event, Frame) and event.opcode in (Opcode.TEXT, Opcode.BINARY):
        _counts(self)[_label(event.data)] += len(event.data)
    _process_event(self, event)


def wire_totals(publisher_ports: set[int]) -> dict[str, Counter]:
    """Bytes received so far per node ("wire", and payload bytes by message type), without the publisher's
    connections (its client ports)."""
    totals: dict[str, Counter] = defaultdict(Counter)
    for conn, (node, counts) in list(WIRE.items()):
        peer = conn.transport.get_extra_info("peername") if conn.transport is not None else None
        if node and not (peer and peer[1] in publisher_ports):
            totals[node].update(counts)
    return totals


# ---------------------------------------------------------------- events
def parse_kinds(text: str) -> dict[int, float]:
    """"1:50,7:25" -> {1: 50.0, 7: 25.0}; only kinds whose events never replace one another."""
    kinds = {}
    for part in text.split(","):
        kind, _, weight = part.partition(":")
        k = int(kind)
        if k in FLEET_WIDE or k in (0, 3) or 10000 <= k < 30000 or not 0 <= k < 40000:
            raise SystemExit(f"--kinds: {k} is fleet-wide, replaceable or ephemeral; use regular or addressable kinds")
        kinds[k] = float(weight or 1)
    return kinds


def words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def make_events(seed: int, n: int, kinds: dict[int, float], n_authors: int) -> list[dict]:
    """`n` signed events (see the module docstring), the same for the same arguments."""
    rng = random.Random(seed)
    keys = [PrivateKey(hashlib.sha256(f"fleet-author:{seed}:{i}".encode()).digest()) for i in range(n_authors)]
    pubkeys = [k.public_key_xonly.format().hex() for k in keys]
    notes: list[dict] = []
    events = []
    for i in range(n):
        kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
        a = int(n_authors * rng.random() ** 2)  # a few authors write most
        created_at = BASE_TS - rng.randrange(86_400)
        tags: list[list[str]] = []
        if kind == 7 and notes:
            target = rng.choice(notes[-500:])
            tags = [["e", target["id"]], ["p", target["pubkey"]], ["k", str(target["kind"])]]
            content = rng.choice(REACTIONS)
        elif kind == 6 and notes:
            target = rng.choice(notes[-500:])
            tags = [["e", target["id"], ""], ["p", target["pubkey"]]]
            content = json.dumps(target, separators=(",", ":"), ensure_ascii=False)
        elif 30000 <= kind < 40000:
            tags = [["d", f"fleet-{seed}-{i}"], ["title", words(rng, 2, 6)]]
            content = words(rng, 150, 600)
        else:
            if kind == 1 and notes and rng.random() < 0.5:
                target = rng.choice(notes[-500:])
                tags = [["e", target["id"], "", "root"], ["p", target["pubkey"]]]
            content = words(rng, 5, 60)
        preimage = json.dumps([0, pubkeys[a], created_at, kind, tags, content], separators=(",", ":"),
                              ensure_ascii=False).encode()
        event_id = hashlib.sha256(preimage).hexdigest()
        event = {"id": event_id, "pubkey": pubkeys[a], "created_at": created_at, "kind": kind, "tags": tags,
                 "content": content, "sig": keys[a].sign_schnorr(bytes.fromhex(event_id)).hex()}
        events.append(event)
        if kind == 1:
            notes.append(event)
    return events


# ---------------------------------------------------------------- the fleet
def layout(n_nodes: int, kinds: dict[int, float]) -> tuple[dict[str, str], dict[str, list[int] | None]]:
    """(name -> [[shards]] text, name -> kinds held, None: every kind) of the archive and the shard nodes."""
    ordered = sorted(kinds, key=lambda k: (-kinds[k], k))
    groups = min(n_nodes - 1, len(ordered))
    shards = [sorted(ordered[g::groups]) for g in range(groups)]
    tomls = {"archive": '[[shards]]\nid = "all"\nfilter = {}\n'}
    held: dict[str, list[int] | None] = {"archive": None}
    for i in range(1, n_nodes):
        group = shards[(i - 1) % groups]
        tomls[f"shard{i}"] = (f'[[shards]]\nid = "kinds-{"-".join(map(str, group))}"\n'
                              f'filter = {{kinds = [{", ".join(map(str, group))}]}}\n')
        held[f"shard{i}"] = group
    return tomls, held


async def start(home: Path, node: Node, peers: list[Node], direction: str = "both") -> None:
    """Start `node` in `home/<name>` with `peers` as its `[[sync.peers]]` (synced every second); the
    connections its start-up makes are credited to it (NODE), and its log lines carry its name."""
    where = home / node.name
    where.mkdir(exist_ok=True)
    (where / "node.key").write_text(node.secret + "\n")
    (where / "node.key").chmod(0o600)
    entries = [{"url": p.url, "pubkey": p.key.pubkey, "direction": direction} for p in peers]
    config = make_config(where, node.toml, server={"port": node.port},
                         limits={"max_limit": 1_000_000, "max_query_rows": 1_000_000,
                                 "max_query_bytes": 64 << 20},
                         sync={"peers": entries, "interval_seconds": 1.0, "secret_key_file": str(where / "node.key"),
                               "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0})
    token = NODE.set(node.name)
    structlog.contextvars.bind_contextvars(node=node.name)
    try:
        node.relay = Relay(config)
        await node.relay.start()
    finally:
        NODE.reset(token)
        structlog.contextvars.unbind_contextvars("node")


async def sharded(nodes: dict[str, Node], claims: dict, timeout: float) -> float:
    """Wait until every node stores every claim of `claims` and syncs with each peer by its shards; seconds."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        ready = True
        for node in nodes.values():
            found = await claim_statuses(node.url)
            if any(found.get(k) != v for k, v in claims.items()) or \
                    any(p.scope is None for p in node.relay.sync.peers):
                ready = False
                break
        if ready:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise SystemExit(f"the fleet did not claim its shards within {timeout:.0f} s (see the log)")
        await asyncio.sleep(0.5)


async def publish(url: str, events: list[dict], ports: set[int]) -> tuple[float, int]:
    """Publish `events` to `url` on one connection, WINDOW in flight; (time of the last OK, refusals)."""
    refused = 0
    async with websockets.connect(url, max_size=None, compression=None) as ws:
        ports.add(ws.local_address[1])
        for start_at in range(0, len(events), WINDOW):
            window = events[start_at:start_at + WINDOW]
            for event in window:
                await ws.send(json.dumps(["EVENT", event], separators=(",", ":"), ensure_ascii=False))
            waiting = {e["id"] for e in window}
            while waiting:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if reply[0] == "OK" and reply[1] in waiting:
                    waiting.discard(reply[1])
                    if reply[2] is not True:
                        refused += 1
        return time.monotonic(), refused


def db_path(node: Node) -> Path:
    return Path(node.relay.config.store.path)


def _read(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def held_ids(path: Path, kinds: list[int]) -> set[str]:
    marks = ",".join("?" * len(kinds))
    return {r[0] for r in _read(path, f"SELECT lower(hex(id)) FROM events WHERE kind IN ({marks})", tuple(kinds))}


def sizes(path: Path, kinds: list[int]) -> dict[str, int]:
    marks = ",".join("?" * len(kinds))
    return dict(_read(path, f"SELECT lower(hex(id)), length(CAST(raw AS BLOB)) FROM events WHERE kind IN ({marks})",
                      tuple(kinds)))


def from_peers(path: Path, kinds: list[int]) -> dict:
    """Events and bytes stored from a peer (origin != ''), of the bench's kinds and of the fleet-wide kinds."""
    marks = ",".join("?" * len(kinds))
    out = {}
    for label, sql, params in (
            ("bench", f"FROM events WHERE origin != '' AND kind IN ({marks})", tuple(kinds)),
            ("fleet_wide", "FROM events WHERE origin != '' AND kind IN (?, ?, ?)", FLEET_WIDE)):
        count, total = _read(path, f"SELECT count(*), coalesce(sum(length(CAST(raw AS BLOB))), 0) {sql}", params)[0]
        out[label] = {"events": count, "bytes": total}
    return out


async def served_ids(url: str, kinds: list[int]) -> set[str]:
    """The ids `url` serves for the bench's kinds (one REQ; the limits are raised in the configuration)."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "all", {"kinds": kinds, "limit": 1_000_000}]))
        found = set()
        while True:
            reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if reply[0] == "EVENT":
                found.add(reply[2]["id"])
            elif reply[0] in ("EOSE", "CLOSED"):
                return found


def from_log(log: Path) -> tuple[Counter, Counter]:
    """Per node: events removed by the guard (its `shard_events_removed` lines), and the times it found a
    peer's claims lapsed (`sync_shards_changed` to no shard: synced with it as a full replica until they
    are back)."""
    removed: Counter = Counter()
    lapses: Counter = Counter()
    for line in log.read_text(errors="replace").splitlines():
        if '"shard_events_removed"' in line:
            entry = json.loads(line)
            removed[entry.get("node", "?")] += entry.get("removed", 0)
        elif '"sync_shards_changed"' in line:
            entry = json.loads(line)
            lapses[entry.get("node", "?")] += entry.get("shards") == []
    return removed, lapses


# ---------------------------------------------------------------- the run
async def run(args: argparse.Namespace, home: Path, log: Path) -> dict:
    kinds = parse_kinds(args.kinds)
    bench_kinds = sorted(kinds)
    t0 = time.monotonic()
    events = make_events(args.seed, args.events, kinds, args.authors)
    signing = time.monotonic() - t0
    tomls, held = layout(args.nodes, kinds)
    if not args.no_replica:
        tomls["replica"] = ""
        held["replica"] = None
    sharding = (f"[sharding]\nmin_copies = {args.min_copies}\nclaim_interval_seconds = {args.claim_interval}\n"
                f"claim_ttl_seconds = {args.claim_ttl}\nmax_clock_skew_seconds = {args.clock_skew}\n")
    nodes = {}
    for i, (name, toml) in enumerate(tomls.items()):  # as tests/sync/fleet.py's fleet(), with our [sharding]
        secret = f"{0xF1EE7 + i:064x}"
        nodes[name] = Node(name, free_port(), Keys(bytes.fromhex(secret)), secret, sharding + toml)
    sharded_nodes = [n for name, n in nodes.items() if name != "replica"]
    rng = random.Random(args.seed + 1)
    to: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        to[rng.choice(sharded_nodes).name].append(event)

    def holds(name: str, kind: int) -> bool:
        return held[name] is None or kind in held[name]

    expected = {name: {e["id"] for e in events if holds(name, e["kind"])} for name in nodes}
    misplaced = {name: sum(not holds(name, e["kind"]) for e in to.get(name, ())) for name in nodes}
    Connection.data_received, Connection.process_event = _counted, _classified
    ports: set[int] = set()
    report: dict = {"args": vars(args) | {"keep": str(args.keep) if args.keep else None}, "log": str(log)}
    try:
        for node in sharded_nodes:
            await start(home, node, [p for p in sharded_nodes if p is not node])
        if "replica" in nodes:
            await start(home, nodes["replica"], sharded_nodes, direction="down")
        claims = {(n.key.pubkey, "all" if held[n.name] is None else f"kinds-{'-'.join(map(str, held[n.name]))}"):
                  "complete" for n in sharded_nodes}
        ready = await sharded(nodes, claims, args.ready_timeout)
        print(f"{len(nodes)} nodes started, every claim complete and every peer synced by shard after "
              f"{time.monotonic() - t0 - signing:.1f} s (waited {ready:.1f} s for the claims)", flush=True)

        idle_before = wire_totals(ports)
        await asyncio.sleep(args.idle)  # the fleet's own traffic without events: claims, sessions finding nothing
        wire_before = wire_totals(ports)
        idle = {name: (wire_before[name]["wire"] - idle_before[name]["wire"]) / args.idle for name in nodes}
        p0 = time.monotonic()
        results = await asyncio.gather(*(publish(nodes[name].url, evs, ports) for name, evs in to.items()))
        last_ok = max(t for t, _ in results)
        refused = sum(r for _, r in results)
        print(f"published {len(events)} events to {len(to)} nodes in {last_ok - p0:.1f} s "
              f"({len(events) / (last_ok - p0):.0f}/s), {refused} refused", flush=True)

        held_at = exact_at = None
        deadline = last_ok + args.timeout
        last: dict[str, set[str]] = {}
        while True:
            last = {name: await asyncio.to_thread(held_ids, db_path(n), bench_kinds) for name, n in nodes.items()}
            now = time.monotonic()
            if held_at is None and all(expected[name] <= last[name] for name in nodes):
                held_at = now
            if all(expected[name] == last[name] for name in nodes):
                exact_at = now
                break
            if now > deadline:
                break
            await asyncio.sleep(POLL)
        wire_after = wire_totals(ports)
        end = time.monotonic()

        served = {name: await served_ids(n.url, bench_kinds) for name, n in nodes.items()}
        event_size = await asyncio.to_thread(sizes, db_path(nodes["archive"]), bench_kinds)
        if len(event_size) != len(events):  # not converged: the archive lacks some; the bench's own serialization
            for e in events:
                event_size.setdefault(e["id"], len(json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode()))
        total_bytes = sum(event_size[e["id"]] for e in events)
        received = {name: await asyncio.to_thread(from_peers, db_path(n), bench_kinds) for name, n in nodes.items()}
    finally:
        for node in nodes.values():
            if node.relay is not None:
                await node.relay.stop()
        Connection.data_received, Connection.process_event = _data_received, _process_event
    removed, lapses = from_log(log)

    copies = Counter()
    for name in (n.name for n in sharded_nodes):
        for event_id in last[name]:
            copies[event_id] += 1
    replica_bytes = received.get("replica", {}).get("bench", {}).get("bytes") or None
    wire = {name: wire_after[name] - wire_before[name] for name in nodes}  # Counter: negative counts dropped
    replica_wire = wire["replica"]["wire"] if "replica" in nodes and wire["replica"]["wire"] else None
    rows = []
    for name, node in nodes.items():
        mine = [e for e in events if holds(name, e["kind"])]
        published_here = {e["id"] for e in to.get(name, ())}
        needed = sum(event_size[e["id"]] for e in mine if e["id"] not in published_here)
        got = received[name]["bench"]
        rows.append({
            "node": name, "kinds": held[name] or "all",
            "expected_events": len(expected[name]), "held_events": len(last[name]),
            "served_events": len(served[name]), "exact": served[name] == expected[name] == last[name],
            "shard_bytes": sum(event_size[e["id"]] for e in mine),
            "shard_share": sum(event_size[e["id"]] for e in mine) / total_bytes,
            "published_here": len(to.get(name, ())), "published_outside_shards": misplaced[name],
            "from_peers_events": got["events"], "from_peers_bytes": got["bytes"],
            "needed_bytes": needed, "from_peers_over_needed": got["bytes"] / needed if needed else None,
            "from_peers_over_replica": got["bytes"] / replica_bytes if replica_bytes else None,
            "fleet_wide_from_peers": received[name]["fleet_wide"],
            "wire_in_bytes": wire[name]["wire"],
            "wire_over_replica": wire[name]["wire"] / replica_wire if replica_wire else None,
            "wire_over_event_bytes": wire[name]["wire"] / total_bytes,
            "wire_payload_bytes": {k: wire[name][k] for k in LABELS},
            "idle_wire_bytes_per_second": round(idle[name]),
            "removed_by_guard": removed.get(name, 0), "peer_claims_lapsed": lapses.get(name, 0),
        })
    report.update({
        "events": len(events), "event_bytes": total_bytes, "kinds": {str(k): w for k, w in kinds.items()},
        "signing_seconds": round(signing, 2), "claims_ready_seconds": round(ready, 2),
        "publish_seconds": round(last_ok - p0, 2), "refused": refused,
        "held_seconds": round(held_at - last_ok, 2) if held_at else None,
        "converged_seconds": round(exact_at - last_ok, 2) if exact_at else None,
        "measured_seconds": round(end - p0, 2), "idle_seconds": args.idle,
        "copies_min": min(copies.values(), default=0), "copies_max": max(copies.values(), default=0),
        "min_copies": args.min_copies, "nodes": rows,
    })
    return report


def mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_report(r: dict) -> None:
    a = r["args"]
    conv = f"{r['converged_seconds']:.1f} s" if r["converged_seconds"] is not None else \
        f"NOT within {r['args']['timeout']:.0f} s"
    held = f"{r['held_seconds']:.1f} s" if r["held_seconds"] is not None else "never"
    print(f"\nseed {r['args']['seed']}: {r['events']} events, {r['event_bytes'] / 1e6:.2f} MB; kinds {r['kinds']}; "
          f"min_copies {r['min_copies']}; claims every {a['claim_interval']:g} s, ttl {a['claim_ttl']:g} s; "
          f"published in {r['publish_seconds']:.1f} s")
    print(f"after the last OK: every node held its shards in {held}, held exactly them (converged) in {conv}; "
          f"copies of an event on the sharded nodes: {r['copies_min']}-{r['copies_max']}")
    head = (f"{'node':<8} {'kinds':<10} {'events':>6} {'exact':>5} {'shard':>6} {'publ.':>5} {'outside':>7} "
            f"{'removed':>7} | {'from peers':>10} {'MB':>6} {'needed':>6} {'/needed':>7} {'/replica':>8}")
    print("\nevents held, and stored from peers (MB of canonical JSON, each event once)")
    print(head)
    print("-" * len(head))
    for n in r["nodes"]:
        kinds = "all" if n["kinds"] == "all" else ",".join(map(str, n["kinds"]))
        print(f"{n['node']:<8} {kinds:<10} {n['held_events']:>6} {'yes' if n['exact'] else 'NO':>5} "
              f"{n['shard_share']:>6.1%} {n['published_here']:>5} {n['published_outside_shards']:>7} "
              f"{n['removed_by_guard']:>7} | {n['from_peers_events']:>10} {mb(n['from_peers_bytes']):>6} "
              f"{mb(n['needed_bytes']):>6} {ratio(n['from_peers_over_needed']):>7} "
              f"{ratio(n['from_peers_over_replica']):>8}")
    head = (f"{'node':<8} {'shard':>6} {'wire MB':>7} {'/all':>5} {'/replica':>8} | "
            + " ".join(f"{k:>6}" for k in LABELS) + f" | {'idle kB/s':>9} {'lapses':>6}")
    print(f"\nbytes received from the other nodes, first publish to convergence ({r['measured_seconds']:.1f} s): "
          f"on the wire, and the payloads by message type (MB)")
    print(head)
    print("-" * len(head))
    for n in r["nodes"]:
        p = n["wire_payload_bytes"]
        print(f"{n['node']:<8} {n['shard_share']:>6.1%} {mb(n['wire_in_bytes']):>7} "
              f"{ratio(n['wire_over_event_bytes']):>5} {ratio(n['wire_over_replica']):>8} | "
              + " ".join(f"{mb(p[k]):>6}" for k in LABELS)
              + f" | {n['idle_wire_bytes_per_second'] / 1e3:>9.1f} {n['peer_claims_lapsed']:>6}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="See the module docstring for what each figure is.")
    parser.add_argument("--seed", type=int, default=1, help="the events and where each is published (default 1)")
    parser.add_argument("--nodes", type=int, default=5, help="the archive and the shard nodes, the replica apart "
                                                              "(default 5, at least 2)")
    parser.add_argument("--events", type=int, default=5000, help="events published (default 5,000)")
    parser.add_argument("--kinds", default="1:50,7:25,6:15,30023:10",
                        help="kind:weight,... regular or addressable kinds (default 1:50,7:25,6:15,30023:10)")
    parser.add_argument("--authors", type=int, default=200, help="author keys (default 200)")
    parser.add_argument("--min-copies", type=int, default=2, help="[sharding] min_copies (default 2)")
    parser.add_argument("--claim-interval", type=float, default=1.0,
                        help="[sharding] claim_interval_seconds (default 1, as the tests)")
    parser.add_argument("--claim-ttl", type=float, default=4.0, help="[sharding] claim_ttl_seconds (default 4)")
    parser.add_argument("--clock-skew", type=float, default=1.0, help="[sharding] max_clock_skew_seconds (default 1)")
    parser.add_argument("--no-replica", action="store_true", help="no full replica beside the fleet")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for convergence after the "
                                                                      "last OK (default 120)")
    parser.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for the claims (60)")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of the fleet's traffic measured before "
                                                                 "publishing (default 3)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (databases, node keys)")
    args = parser.parse_args()
    if args.nodes < 2 or args.events < 1 or not 1 <= args.min_copies:
        parser.error("--nodes 2 or more, --events 1 or more, --min-copies 1 or more")
    if args.min_copies > args.nodes - 1:
        parser.error(f"--min-copies {args.min_copies}: an event published outside its shards has at most "
                     f"{args.nodes - 1} other holders")
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    log = RESULTS / "logs" / f"fleet-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with open(log, "w", encoding="utf-8") as out:
        structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                        structlog.processors.TimeStamper(fmt="iso", utc=True),
                                        structlog.processors.JSONRenderer()],
                            wrapper_class=structlog.make_filtering_bound_logger(20),  # info
                            logger_factory=structlog.WriteLoggerFactory(file=out), cache_logger_on_first_use=True)
        with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
            home = args.keep or Path(tmp)
            home.mkdir(parents=True, exist_ok=True)
            report = asyncio.run(run(args, home, log))
    print_report(report)
    write_results("fleet", report)
    return 0 if report["converged_seconds"] is not None and all(n["exact"] for n in report["nodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
