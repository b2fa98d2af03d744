"""A seeded workload played on a `Mesh` (tests/sync/mesh.py) while its nodes are killed and partitioned, and the
checks of the state the nodes converge to.

How this works
--------------
`script(seed, nodes)` turns a seed into a list of steps.  Per coordinate
(kinds 0, 3, 10002 and 30023 with two `d` values, for three authors) a story:
one to four versions at close created_at (ties are frequent), maybe an `e`
deletion of the newest one, an `e` deletion of another one, an `a` deletion,
a version expiring (NIP-40) seconds after it is sent; per kind-1 note a
story too: maybe deleted by its author, by another author (no effect), with
the deletion deleted (no effect), or expiring.  Each story's events are in a
random order (a deletion often comes before its target), each sent to a
random node; the stories are interleaved at random, and SIGKILLs (the node
restarted a few steps later), one partition (SIGTERM, restarted later; the
events meanwhile sent to it are skipped) and pauses (time for sync) are
inserted.  All randomness comes from the seed; which events a node accepts
depends on timing, so the ledger records the OKs and the model takes only
accepted events.

`run` plays a script, waits until every node serves the same events, and
checks them (`MeshReport.failures`) against `model_failures`:

- a regular event is served iff accepted, not deleted by an `e` tag of its
  author (a deletion's deletion has no effect) and not expired;
- per coordinate, the candidates are its accepted versions that are not
  `e`-deleted, not covered by an `a` deletion of their author (created_at up
  to the deletion's) and not expired; what is served is nothing or one
  candidate, and it is the newest candidate whenever that one is newer than
  every version that is not a candidate;
- a version `e`-deleted by its author (accepted, or refused because its
  deletion came first) leaves its coordinate's high-water mark on every node
  (docs/architecture.md, invariant 5: the mark and its evidence travel), so no older
  version is served, unless it or a newer version expires: an expired
  version leaves no mark, nor the one it replaced, and which older candidate
  survives then depends on timing;

then compares every node's projected tables and stored events, and runs
`relay verify` on every database.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from tests.helpers import Keys, eventually
from tests.model import first_tag, is_addressable, is_replaceable
from tests.sync.mesh import TOPOLOGIES, Mesh, expired_events, projected_tables, table_dumps, verify

BASE = 1_700_000_000  # created_at of the workload: fixed, so that ids (and ties broken by id) follow the seed
AUTHORS = [Keys(0x3E5A + i) for i in range(3)]
COORDINATES = [(0, ""), (3, ""), (10002, ""), (30023, "a"), (30023, "b")]  # (kind, d_tag) per author
NOTES = 12
KILLS = 2
PAUSES = 6  # pauses of 0.2 to 1 s between steps, so that nodes sync in the middle of the workload
PURGE_SECONDS = 1.0
POLL_SECONDS = 0.25  # between two rounds of REQs to every node while waiting for convergence
PURGE_TIMEOUT = 10 * PURGE_SECONDS  # seconds for every node to purge the events that expired
MESH_SETTINGS = {
    "limits": {"default_limit": 100_000, "max_limit": 100_000},  # one REQ {} serves every event
    "rate_limits": {"enabled": False},  # the test and every node's sync come from 127.0.0.1
    "store": {"expiry_purge_interval_seconds": PURGE_SECONDS},
    "sync": {"interval_seconds": 1.0},
}


# --- the script ------------------------------------------------------------------------------------------


@dataclass
class Expiring:
    """An event signed when it is sent, with a NIP-40 expiration `seconds` after that moment."""

    keys: Keys
    kind: int
    tags: list
    content: str
    created_at: int
    seconds: int

    def sign(self) -> dict:
        """The signed event, expiring `seconds` from now."""
        expiration = ["expiration", str(int(time.time()) + self.seconds)]
        return self.keys.sign(self.kind, self.content, [*self.tags, expiration], self.created_at)


@dataclass(frozen=True)
class Publish:
    """Send an event to a node and record its OK; skipped while the node is down."""

    node: int
    event: dict | Expiring

    async def run(self, mesh: Mesh, ledger: Ledger) -> None:
        if mesh.nodes[self.node].running:
            event = self.event.sign() if isinstance(self.event, Expiring) else self.event
            ledger.record(event, await mesh.publish(self.node, event))


@dataclass(frozen=True)
class Down:
    """Take a running node down until a later `Start`: SIGKILL (a crash) or SIGTERM (a partition)."""

    node: int
    kill: bool

    async def run(self, mesh: Mesh, ledger: Ledger) -> None:
        if not mesh.nodes[self.node].running:
            return
        if self.kill:
            await mesh.kill(self.node)
            ledger.kills += 1
        else:
            await mesh.stop(self.node)
            ledger.stops += 1


@dataclass(frozen=True)
class Start:
    """Restart a node that is down."""

    node: int

    async def run(self, mesh: Mesh, ledger: Ledger) -> None:
        if not mesh.nodes[self.node].running:
            mesh.start(self.node)
            ledger.last_start = time.monotonic()


@dataclass(frozen=True)
class Pause:
    """Publish nothing for a while: the nodes sync."""

    seconds: float

    async def run(self, mesh: Mesh, ledger: Ledger) -> None:
        await asyncio.sleep(self.seconds)


Step = Publish | Down | Start | Pause


class _Writer:
    """Makes the stories' events (contents, tags and created_at from `rng`), each sent to a random node."""

    def __init__(self, rng: random.Random, nodes: int) -> None:
        self.rng = rng
        self.nodes = nodes
        self.nonce = 0

    def _sent(self, events: list) -> list[Publish]:
        self.rng.shuffle(events)  # a deletion often comes before its target
        return [Publish(self.rng.randrange(self.nodes), e) for e in events]

    def _deletion(self, keys: Keys, tags: list, created_at: int) -> dict:
        self.nonce += 1
        return keys.sign(5, f"deletion {self.nonce}", tags, created_at)

    def _version(self, kind: int, d_tag: str, created_at: int) -> tuple[list, str]:
        """(tags, content) of a version that the built-in projectors turn into rows."""
        self.nonce += 1
        n, rng = self.nonce, self.rng
        if kind == 0:
            return [], json.dumps({"name": f"name {n}", "about": f"version {n}"})
        if kind == 3:
            return [["p", f"{rng.getrandbits(256):064x}", "wss://r.example", f"pet{n}"]
                    for _ in range(rng.randint(1, 4))], ""
        if kind == 10002:
            return [["r", f"wss://{rng.randrange(5)}.example", rng.choice(["read", "write"])] for _ in range(3)], ""
        return [["d", d_tag], ["title", f"title {n}"], ["published_at", str(created_at)]], f"article {n}"

    def coordinate(self, keys: Keys, kind: int, d_tag: str, start: int) -> list[Publish]:
        """Versions of one coordinate and deletions of them (module docstring)."""
        rng = self.rng
        versions = []
        for _ in range(rng.randint(1, 4)):
            created_at = start + rng.randrange(3)
            tags, content = self._version(kind, d_tag, created_at)
            versions.append(keys.sign(kind, content, tags, created_at))
        newest_first = sorted(versions, key=lambda e: (-e["created_at"], e["id"]))  # NIP-01: ties keep the lowest id
        events: list = list(versions)
        if rng.random() < 0.5:
            events.append(self._deletion(keys, [["e", newest_first[0]["id"]]], start + 10))
        if len(versions) > 1 and rng.random() < 0.3:
            events.append(self._deletion(keys, [["e", rng.choice(newest_first[1:])["id"]]], start + 10))
        if rng.random() < 0.25:
            events.append(self._deletion(keys, [["a", f"{kind}:{keys.pubkey}:{d_tag}"]], start + rng.randrange(-1, 3)))
        if rng.random() < 0.2:  # newer than the others, then gone: an older version may come back
            tags, content = self._version(kind, d_tag, start + 5)
            events.append(Expiring(keys, kind, tags, content, start + 5, rng.randint(2, 6)))
        return self._sent(events)

    def note(self, keys: Keys, created_at: int) -> list[Publish]:
        """A kind-1 note and what may delete it (module docstring)."""
        rng = self.rng
        self.nonce += 1
        if rng.random() < 0.2:
            return self._sent([Expiring(keys, 1, [["t", "mesh"]], f"note {self.nonce}", created_at, rng.randint(2, 6))])
        note = keys.sign(1, f"note {self.nonce}", [["t", "mesh"]], created_at)
        events = [note]
        roll = rng.random()
        if roll < 0.4:
            events.append(self._deletion(keys, [["e", note["id"]]], created_at + 1))
            if rng.random() < 0.3:  # NIP-09: deleting a deletion has no effect
                events.append(self._deletion(keys, [["e", events[-1]["id"]]], created_at + 2))
        elif roll < 0.5:  # another author's deletion has no effect
            events.append(self._deletion(rng.choice([k for k in AUTHORS if k is not keys]), [["e", note["id"]]],
                                         created_at + 1))
        return self._sent(events)


def _interleave(rng: random.Random, stories: list[list[Publish]]) -> list[Step]:
    """The stories' steps mixed at random, each story's in its own order."""
    slots = [i for i, story in enumerate(stories) for _ in story]
    rng.shuffle(slots)
    steps = [iter(story) for story in stories]
    return [next(steps[i]) for i in slots]


def _disturb(rng: random.Random, steps: list[Step], nodes: int) -> list[Step]:
    """Insert KILLS kills (each node restarted 0 to 5 steps later), one partition of another node (restarted
    after an eighth to half of the steps) and PAUSES pauses; then a restart of every node still down."""
    n = len(steps)
    extra: dict[int, list[Step]] = defaultdict(list)
    partitioned = rng.randrange(nodes)
    stop_at = rng.randrange(n // 4, n // 2)
    extra[stop_at].append(Down(partitioned, kill=False))
    extra[rng.randrange(stop_at + n // 8, stop_at + n // 2)].append(Start(partitioned))
    for _ in range(KILLS):
        at, node = rng.randrange(n), rng.choice([i for i in range(nodes) if i != partitioned])
        extra[at].append(Down(node, kill=True))
        extra[at + rng.randint(0, 5)].append(Start(node))
    for _ in range(PAUSES):
        extra[rng.randrange(n)].append(Pause(round(rng.uniform(0.2, 1.0), 2)))
    out: list[Step] = []
    for i, step in enumerate(steps):
        out += [*extra.pop(i, []), step]
    return out + [s for i in sorted(extra) for s in extra[i]] + [Start(i) for i in range(nodes)]


def script(seed: int, nodes: int) -> list[Step]:
    """The steps of one run for `nodes` nodes; the same seed gives the same steps (module docstring)."""
    rng = random.Random(seed)
    writer = _Writer(rng, nodes)
    stories = [writer.coordinate(keys, kind, d_tag, BASE + 100 * i)
               for i, (keys, (kind, d_tag)) in enumerate(product(AUTHORS, COORDINATES))]
    stories += [writer.note(rng.choice(AUTHORS), BASE + 10_000 + 10 * i) for i in range(NOTES)]
    return _disturb(rng, _interleave(rng, stories), nodes)


# --- playing it --------------------------------------------------------------------------------------------


@dataclass
class Ledger:
    """What the steps did: events accepted (OK true) by id, events refused (and counts by prefix), kills,
    partitions, the latest NIP-40 expiration sent (unix seconds) and when a node last restarted (time.monotonic())."""

    accepted: dict[str, dict] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    refusals: dict[str, tuple[dict, str]] = field(default_factory=dict)  # id -> (event, OK message)
    published: int = 0
    kills: int = 0
    stops: int = 0
    expires: int = 0
    last_start: float = 0.0

    def record(self, event: dict, reply: list) -> None:
        """Note `event` as sent and its OK `reply` (NIP-01)."""
        self.published += 1
        expiration = first_tag(event, "expiration")
        if expiration is not None:
            self.expires = max(self.expires, int(expiration))
        if reply[2]:
            self.accepted[event["id"]] = event
        else:
            self.refused[reply[3].partition(":")[0]] += 1
            self.refusals[event["id"]] = (event, reply[3])


async def converge(mesh: Mesh, timeout: float) -> float | None:
    """When (time.monotonic()) every node first served the same events, seen twice in a row (POLL_SECONDS
    apart); None if they do not within `timeout` seconds."""
    started, first = time.monotonic(), None
    while time.monotonic() - started < timeout:
        views = await mesh.served_all()
        if all(view == views[0] for view in views[1:]):
            if first is not None:
                return first
            first = time.monotonic()
        else:
            first = None
        await asyncio.sleep(POLL_SECONDS)
    return None


# --- the checks --------------------------------------------------------------------------------------------


def _coordinate(event: dict) -> tuple | None:
    kind = event["kind"]
    if is_replaceable(kind):
        return (kind, event["pubkey"], "")
    if is_addressable(kind):
        return (kind, event["pubkey"], first_tag(event, "d") or "")
    return None


def _newer(a: dict, b: dict) -> bool:
    # NIP-01: the larger created_at wins; on a tie the lowest id
    return (a["created_at"], b["id"]) > (b["created_at"], a["id"])


def _deletions(accepted: dict[str, dict]) -> tuple[set[tuple[str, str]], dict[tuple, int]]:
    """(event id, deleter) pairs named by `e` tags, and coordinate -> newest created_at of an `a` deletion."""
    named, until = set(), {}
    for deletion in (e for e in accepted.values() if e["kind"] == 5):
        for tag in (t for t in deletion["tags"] if len(t) > 1):
            if tag[0] == "e":
                named.add((tag[1], deletion["pubkey"]))
            kind, _, rest = tag[1].partition(":")
            pubkey, _, d_tag = rest.partition(":")
            if tag[0] == "a" and kind.isdigit() and pubkey == deletion["pubkey"]:
                key = (int(kind), pubkey, d_tag if is_addressable(int(kind)) else "")
                until[key] = max(until.get(key, -1), deletion["created_at"])
    return named, until


def model_failures(served: dict[str, dict], accepted: dict[str, dict], now: float,
                   refusals: dict[str, tuple[dict, str]] | None = None) -> list[str]:
    """What one node's REQ `{}` answer (id -> event) gets wrong against the model of `accepted` (docstring).

    `refusals` (id -> (event, OK message)): a version refused as deleted still raised its coordinate's mark.
    """
    refusals = refusals or {}
    named, until = _deletions(accepted)
    refused_deleted = [e for e, message in refusals.values() if "deleted" in message and e["id"] not in accepted]
    marks: dict[tuple, list[dict]] = defaultdict(list)  # coordinate -> e-deleted versions no expiry undoes
    every = [*accepted.values(), *refused_deleted]
    expiring = [e for e in every if _coordinate(e) is not None and first_tag(e, "expiration") is not None]
    for e in every:
        if (_coordinate(e) is not None and (e["id"], e["pubkey"]) in named
                and not any(_coordinate(x) == _coordinate(e) and not _newer(e, x) for x in expiring)):
            marks[_coordinate(e)].append(e)

    def is_candidate(e: dict) -> bool:
        expiration = first_tag(e, "expiration")
        return not ((expiration is not None and int(expiration) <= now)
                    or (e["kind"] != 5 and (e["id"], e["pubkey"]) in named)
                    or e["created_at"] <= until.get(_coordinate(e), -1))

    failures = []
    changed = sorted(i for i, e in served.items() if accepted.get(i) != e)
    if changed:
        failures.append(f"served {len(changed)} events never accepted as such, e.g. {changed[:3]}")
    regular = {i for i, e in accepted.items() if _coordinate(e) is None and is_candidate(e)}
    served_regular = {i for i, e in served.items() if _coordinate(e) is None}
    if served_regular != regular:
        failures.append(f"regular events: missing {sorted(regular - served_regular)[:5]}, "
                        f"unexpected {sorted(served_regular - regular)[:5]}")
    versions, live = defaultdict(list), defaultdict(list)
    for events, by_coordinate in (([*accepted.values(), *refused_deleted], versions), (served.values(), live)):
        for e in events:
            if _coordinate(e) is not None:
                by_coordinate[_coordinate(e)].append(e)
    for key in versions.keys() | live.keys():
        candidates = sorted((e for e in versions[key] if is_candidate(e)), key=lambda e: (-e["created_at"], e["id"]))
        others = [e for e in versions[key] if not is_candidate(e)]
        held = [e["id"] for e in live[key]]
        label = f"{key[0]}:{key[1][:8]}:{key[2]}"
        if len(held) > 1 or not set(held) <= {e["id"] for e in candidates}:
            failures.append(f"{label}: serves {held}, not none or one of the candidates "
                            f"{[e['id'] for e in candidates]}")
        elif candidates and all(_newer(candidates[0], e) for e in others) and held != [candidates[0]["id"]]:
            refused = [(e["id"], message) for e, message in refusals.values()
                       if _coordinate(e) == key and _newer(e, candidates[0])]
            failures.append(f"{label}: serves {held}, not the newest candidate {candidates[0]['id']}, which is "
                            f"newer than every version deleted or expired"
                            + (f" (newer versions refused when published: {refused})" if refused else ""))
        elif held and (newer := [e["id"] for e in marks[key] if _newer(e, live[key][0])]):
            failures.append(f"{label}: serves {held}, older than its deleted versions {newer} (their mark)")
    return failures


def _differences(views: list[dict[str, dict]]) -> list[str]:
    """How the nodes' REQ answers differ: events a node lacks that another serves, events served with other bytes."""
    everything = {i: e for view in views for i, e in view.items()}
    failures = []
    for n, view in enumerate(views):
        lacking = sorted(everything.keys() - view.keys())
        if lacking:
            failures.append(f"node {n} lacks {len(lacking)} of the {len(everything)} events served, e.g. "
                            f"{[(i, everything[i]['kind']) for i in lacking[:3]]}")
        other = sorted(i for i, e in view.items() if any(v.get(i, e) != e for v in views))
        if other:
            failures.append(f"node {n} serves {len(other)} events with other bytes than another node: {other[:3]}")
    return failures


def _stored_failures(mesh: Mesh) -> list[str]:
    """Expired events still stored, projected tables and stored events that differ between nodes, and `relay
    verify` outcomes that are not clean."""
    tables = projected_tables(mesh.nodes[0])
    dumps = [table_dumps(node.db, tables) for node in mesh.nodes]
    failures = [f"node {i} still stores expired events {expired[:3]}"
                for i, node in enumerate(mesh.nodes) if (expired := expired_events(node.db, time.time()))]
    failures += [f"table {table}: node {i} has {len(dump[table])} rows, {len(set(dump[table]) ^ set(dumps[0][table]))}"
                 f" differ from node 0's {len(dumps[0][table])}"
                 for table in ["events", *tables] for i, dump in enumerate(dumps) if dump[table] != dumps[0][table]]
    for i, node in enumerate(mesh.nodes):
        code, out = verify(node)
        if code != 0:
            failures.append(f"node {i}: relay verify exited {code}:\n{out}")
    return failures


@dataclass
class MeshReport:
    """One run: its shape, what was published, how long the nodes took to converge, and what was wrong."""

    seed: int
    topology: str
    nodes: int
    ledger: Ledger = field(default_factory=Ledger)
    seconds: float | None = None  # from the last step to the same events on every node; None: not within the bound
    after_restart: float | None = None  # from the last restart of a node to the same events on every node
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line for people."""
        converged = "did not converge" if self.seconds is None else \
            f"converged {self.seconds:.1f} s after the last step ({self.after_restart:.1f} s after the last restart)"
        return (f"seed {self.seed}, {self.topology} of {self.nodes}: published {self.ledger.published} "
                f"(accepted {len(self.ledger.accepted)}, refused {dict(self.ledger.refused)}), "
                f"{self.ledger.kills} kills, {self.ledger.stops} partitions, {converged}, "
                f"{len(self.failures)} failures")


async def _settle(mesh: Mesh, report: MeshReport, timeout: float) -> list[dict[str, dict]]:
    """After the last step: wait for convergence (noting its time), then for every expired event to be purged;
    returns what each node serves then."""
    ended = time.monotonic()
    converged = await converge(mesh, timeout)
    if converged is not None:
        report.seconds, report.after_restart = converged - ended, converged - report.ledger.last_start
    else:
        report.failures.append(f"the nodes did not serve the same events within {timeout} s")
    # Expired events leave REQ answers at once, the database (and the projected tables) at a node's next purge.
    await asyncio.sleep(max(0.0, report.ledger.expires + 1 - time.time()))
    await eventually(lambda: not any(expired_events(node.db, time.time()) for node in mesh.nodes), PURGE_TIMEOUT)
    return await mesh.served_all()


async def run(workdir: Path, seed: int, nodes: int, topology: str, timeout: float = 30.0) -> MeshReport:
    """Play `script(seed, nodes)` on a `topology` ("ring" or "mesh") of `nodes` relays in `workdir`, wait (up to
    `timeout` seconds) until they serve the same events, and check them (module docstring)."""
    report = MeshReport(seed, topology, nodes)
    async with Mesh(workdir, TOPOLOGIES[topology](nodes), MESH_SETTINGS) as mesh:
        for step in script(seed, nodes):
            await step.run(mesh, report.ledger)
        views = await _settle(mesh, report, timeout)
        await mesh.close()  # the databases are read once no process writes them
    report.failures += _differences(views)
    for i, view in enumerate(views):
        if view not in views[:i]:  # one check per distinct answer
            found = model_failures(view, report.ledger.accepted, time.time(), report.ledger.refusals)
            report.failures += [f"node {i}: {f}" for f in found]
    report.failures += _stored_failures(mesh)
    refused = set(report.ledger.refused) - {"duplicate", "blocked"}
    if refused:
        report.failures.append(f"refusals other than newer versions held and deleted events: {refused}")
    return report
