"""Crash harness: publish to a `relay serve` subprocess from several connections, SIGKILL it at random
moments, restart it on the same database, and check after every restart what survived.

How this works
--------------
`Workload` makes the events (real ones from /work/shared/data, and freshly signed ones from a few keys:
regular, replaceable, addressable, NIP-09 `e` and `a` deletions, ephemeral, and events re-sent after a
crash left them unanswered) and keeps the ledger: every event sent, every one answered `OK true`.  One
cycle of `run` starts the relay, checks it, lets the connections publish until a random number of OKs has
arrived, then SIGKILLs it; one cycle in `STARTUP_KILL_ODDS` kills it while it starts instead (imports,
migrations, projector and negentropy set-up).  Before one start in `REVISION_CHANGE_ODDS` the built-in
projectors' revision changes, so that start rebuilds their tables in batches (and may be killed mid-way).
With `workers` (`relay serve --workers N`), the first cycle after each start SIGKILLs a random worker
instead: the relay starts another, the clients reconnect and the relay is checked while it runs; the next
cycle kills the writer, and its workers must exit on their own.  The database, config and relay logs stay
in `workdir`.

The check after a restart (`check_relay`):

* The stored events C satisfy acked <= C <= sent.  Every committed event that is not served was
  superseded or deleted, and an `e` deletion here only names events already acknowledged, so an event
  committed without its OK can hide an effect only behind a served event or an acknowledged one: the live
  set C implies is `expected_live(acked | served)` (tests/model.py), and a REQ must serve exactly that.
  An acknowledged event missing is a lost event; any other difference a wrong supersession or deletion.
* Every served event is byte-for-byte one that was sent.
* `relay verify` (projected tables and negentropy indexes equal their recomputation) exits 0.
* `PRAGMA integrity_check` answers "ok".
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import random
import re
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import websockets
from websockets.exceptions import ConnectionClosed

from relay.channel.worker import WRITER_GONE
from relay.config import Config, load_config
from relay.store.projectors import BUILTIN_PROJECTORS
from relay.commands.projectors import run_verify
from tests.helpers import REAL_EVENTS, Client, Keys, eventually, read_jsonl
from tests.model import expected_live, first_tag
from tests.served import START_TIMEOUT, Served

CONFIG_TOML = """\
[limits]
default_limit = 1000000            # one REQ serves every stored event to the check
max_limit = 1000000

[store]
max_batch = 64                     # many small transactions: kills land between and inside commits
checkpoint_interval_seconds = 0.2  # frequent WAL checkpoints: kills land inside them too
projector_rebuild_batch = 200      # a projector rebuild at start-up takes many transactions

[negentropy]
filters = [{ kinds = [0, 3, 10002, 30023] }]  # a second index kept in the write transaction

[rate_limits]
enabled = false                    # every connection comes from 127.0.0.1 at full speed
"""
PRIVATE_KINDS = (4, 1059)  # [auth] private_kinds (the default): served to their author or recipient only
STARTUP_KILL_ODDS = 0.15  # share of cycles killed during start-up rather than while publishing
REVISION_CHANGE_ODDS = 0.2  # share of starts with the projectors' revision changed (a rebuild)
REPO_CONFIG = Path(__file__).resolve().parents[2] / "config" / "relay.toml"
WINDOW = 16  # EVENTs per connection awaiting their OK


def config_text(revision: int) -> str:
    """CONFIG_TOML plus the built-in [[projectors]] of config/relay.toml, all at `revision`."""
    source = REPO_CONFIG.read_text(encoding="utf-8")
    projectors = source[re.search(r"(?m)^\[\[projectors\]\]", source).start():]
    text, count = re.subn(r"(?m)^revision = \d+", f"revision = {revision:d}", projectors)
    assert count == len(BUILTIN_PROJECTORS), "config/relay.toml: one `revision = N` line per built-in projector"
    return CONFIG_TOML + "\n" + text


def real_events(limit: int | None = None) -> list[dict]:
    """Real events whose fate does not depend on the clock or on events we do not send.

    Without kind 5 (their targets may be events we never send), NIP-40
    expiration tags, ephemeral kinds and NIP-42 private kinds (an
    unauthenticated REQ is not served them).
    """
    events = [e for e in read_jsonl(REAL_EVENTS)
              if e["kind"] != 5 and not 20000 <= e["kind"] < 30000 and e["kind"] not in PRIVATE_KINDS
              and first_tag(e, "expiration") is None]
    return events[:limit]


class Workload:
    """The events to publish and the ledger of what was sent and acknowledged.

    `sent` and `acked` map event id -> event; `pending` holds the events
    sent and not answered yet; `refused` counts OK false replies by prefix, except a worker's answer that
    it lost the writer (with workers), which leaves the event as unanswered as a kill does.
    """

    def __init__(self, seed: int, real: list[dict], authors: int = 6) -> None:
        self.rng = random.Random(seed)
        self.keys = [Keys(0xC4A5 + i) for i in range(authors)]
        self.real = list(real)
        self.rng.shuffle(self.real)
        self.sent: dict[str, dict] = {}
        self.acked: dict[str, dict] = {}
        self.pending: dict[str, dict] = {}
        self.unanswered: list[dict] = []  # pending when the relay was killed: re-sent later
        self.acked_of: dict[str, list[str]] = {k.pubkey: [] for k in self.keys}
        self.refused: Counter[str] = Counter()
        self.kinds: Counter[int] = Counter()
        self.base = int(time.time()) - 3600  # created_at in [base, base + 3000): all in the past
        self.nonce = 0
        self.answers = 0
        self.target: tuple[int, asyncio.Event] | None = None

    def next_event(self) -> dict:
        """The next event to send: a mix weighted towards the supersession and deletion paths."""
        rng, keys = self.rng, self.rng.choice(self.keys)
        roll = rng.random()
        if roll < 0.2 and self.real:
            event = self.real.pop()
        elif roll < 0.26 and self.unanswered:
            event = self.unanswered.pop(rng.randrange(len(self.unanswered)))
        elif roll < 0.36 and self.acked_of[keys.pubkey]:
            event = self._deletion(keys, [["e", i] for i in self._targets(keys)])
        elif roll < 0.41:
            kind = rng.choice([0, 10002, 30023])
            d = str(rng.randrange(3)) if kind == 30023 else ""
            event = self._deletion(keys, [["a", f"{kind}:{keys.pubkey}:{d}"]])
        else:
            event = self._fresh(keys, rng.random())
        return self.record(event)

    def record(self, event: dict) -> dict:
        """Note `event` as sent and pending; returns what to send.  An event identical to one made before
        (same id: same author, kind, created_at, tags, content) keeps its first signature, since BIP-340
        signatures are randomized: the relay serves the copy it stored first."""
        event = self.sent.setdefault(event["id"], event)
        self.pending[event["id"]] = event
        self.kinds[event["kind"]] += 1
        return event

    def _created_at(self) -> int:
        return self.base + self.rng.randrange(3000)  # arrival order differs from created_at order; ties happen

    def _targets(self, keys: Keys) -> list[str]:
        # NIP-09 `e` targets: only acknowledged events (module docstring), sometimes another author's (no effect)
        own = self.acked_of[keys.pubkey]
        targets = self.rng.sample(own, min(len(own), self.rng.randint(1, 3)))
        other = self.acked_of[self.rng.choice(self.keys).pubkey]
        if other and self.rng.random() < 0.2:
            targets.append(self.rng.choice(other))
        return targets

    def _deletion(self, keys: Keys, tags: list) -> dict:
        self.nonce += 1
        return keys.sign(5, f"deletion {self.nonce}", tags, self._created_at())

    def _fresh(self, keys: Keys, roll: float) -> dict:
        self.nonce += 1
        n, rng = self.nonce, self.rng
        if roll < 0.25:
            return keys.sign(1, f"note {n}", [["t", "crash"]], self._created_at())
        if roll < 0.45:
            content = rng.choice([orjson.dumps({"name": f"name {n}", "about": "x"}).decode(), "not json"])
            return keys.sign(0, content, [], self._created_at())
        if roll < 0.6:
            tags = [["p", f"{rng.randrange(50):064x}", "wss://r.example", f"pet{n}"] for _ in range(rng.randint(1, 30))]
            return keys.sign(3, "", tags, self._created_at())
        if roll < 0.7:
            tags = [["r", f"wss://{rng.randrange(10)}.example", rng.choice(["read", "write"])] for _ in range(4)]
            return keys.sign(10002, "", tags, self._created_at())
        if roll < 0.95:
            created_at = self._created_at()
            tags = [["d", str(rng.randrange(3))], ["title", f"t{n}"], ["published_at", str(created_at)]]
            return keys.sign(30023, f"article {n}", tags, created_at)
        return keys.sign(20001, f"ephemeral {n}", [], self._created_at())

    def answered(self, event_id: str, accepted: bool, message: str) -> None:
        """Record an OK reply (NIP-01) for an event this workload sent."""
        event = self.pending.pop(event_id, None)
        if event is None:
            return  # the same event sent twice at once: the first answer counted
        if accepted:
            self.acked[event_id] = event
            if event["pubkey"] in self.acked_of:
                self.acked_of[event["pubkey"]].append(event_id)
        elif message == WRITER_GONE.message:
            self.unanswered.append(event)  # a worker that lost the writer: maybe committed, as if unanswered
        else:
            self.refused[message.partition(":")[0]] += 1
        self.answers += 1
        if self.target is not None and self.answers >= self.target[0]:
            self.target[1].set()

    def crashed(self) -> None:
        """The relay was killed: the events still awaiting an answer may or may not be stored."""
        self.unanswered.extend(self.pending.values())
        self.pending.clear()


async def publish(url: str, workload: Workload, stop: asyncio.Event, window: int = WINDOW) -> None:
    """One connection sending `workload` events, at most `window` unanswered, until `stop` or the socket dies."""
    try:
        async with websockets.connect(url, max_size=None, open_timeout=10, close_timeout=1) as ws:
            slots = asyncio.Semaphore(window)

            async def read_oks() -> None:
                try:
                    async for frame in ws:
                        message = orjson.loads(frame)
                        if message[0] == "OK":
                            workload.answered(message[1], message[2], message[3])
                            slots.release()
                except ConnectionClosed:
                    pass
                finally:
                    stop.set()
                    for _ in range(window):
                        slots.release()  # wake the sender: nothing more will be answered

            reader = asyncio.create_task(read_oks())
            while not stop.is_set():
                await slots.acquire()
                if stop.is_set():
                    break
                await ws.send(orjson.dumps(["EVENT", workload.next_event()]).decode())
            reader.cancel()
    except (ConnectionClosed, OSError, TimeoutError):
        pass  # killed: what was answered is in the ledger


async def check_relay(url: str, config: Config, workload: Workload) -> tuple[int, list[str]]:
    """The checks of the module docstring on a freshly restarted relay: (events served, failures found)."""
    client = await Client.connect(url)
    try:
        served = {e["id"]: e for e in await client.req("all", {})}
    finally:
        await client.close()
    failures = []
    phantom = [i for i, e in served.items() if workload.sent.get(i) != e]
    if phantom:
        failures.append(f"served {len(phantom)} events never sent as such, e.g. {phantom[:3]}")
    expected = set(expected_live([*workload.acked.values(), *served.values()], time.time()))
    lost = sorted(i for i in expected - set(served) if i in workload.acked)
    if lost:
        failures.append(f"lost {len(lost)} acknowledged events, e.g. "
                        f"{[(i, workload.acked[i]['kind']) for i in lost[:5]]}")
    wrong = sorted((expected ^ set(served)) - set(lost))
    if wrong:
        failures.append(f"{len(wrong)} events served or not against the NIP-01/09 model, e.g. "
                        f"{[(i, workload.sent[i]['kind'], i in served) for i in wrong[:5]]}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run_verify(config)
    if code != 0:
        failures.append(f"relay verify exited {code}:\n{out.getvalue()}")
    conn = sqlite3.connect(Path(config.store.path).resolve().as_uri() + "?mode=ro", uri=True)
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()
    if integrity != [("ok",)]:
        failures.append(f"PRAGMA integrity_check: {integrity[:10]}")
    return len(served), failures


@dataclass
class CrashReport:
    """What a run did: kills (of which during start-up), events sent and acknowledged, failures found."""

    kills: int = 0
    startup_kills: int = 0
    worker_kills: int = 0  # with workers: kills of one worker (the others, of the writer)
    revisions: int = 0
    checks: int = 0
    sent: int = 0
    acked: int = 0
    served: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def record(self, workload: Workload, started: float) -> None:
        """Take the ledger's counts and the time since `started` (time.monotonic())."""
        self.sent, self.acked, self.refused = len(workload.sent), len(workload.acked), dict(workload.refused)
        self.seconds = time.monotonic() - started

    def summary(self) -> str:
        """One line for people: kills survived, events, refusals, failures."""
        return (f"kills {self.kills} ({self.startup_kills} during start-up, {self.worker_kills} of a worker), "
                f"checks {self.checks}, "
                f"projector revision changes {self.revisions}, "
                f"sent {self.sent}, acked {self.acked}, served {self.served}, refused {self.refused}, "
                f"failures {len(self.failures)}, {self.seconds:.1f} s")


async def publish_then_kill(url: str, workload: Workload, rng: random.Random, connections: int,
                            answers_per_kill: int, kill: Callable[[], str | None]) -> str | None:
    """`connections` clients publish to `url` until a random number (1 to `answers_per_kill`) of OK replies
    arrived, then `kill()` runs a moment later; once every client stopped (their unanswered events go to the
    ledger as possibly stored), returns what `kill()` returned (a failure found, or None)."""
    reached, stop = asyncio.Event(), asyncio.Event()
    workload.target = (workload.answers + rng.randint(1, answers_per_kill), reached)
    publishers = [asyncio.create_task(publish(url, workload, stop)) for _ in range(connections)]
    waiter = asyncio.create_task(reached.wait())
    await asyncio.wait([waiter, *publishers], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    await asyncio.sleep(rng.uniform(0.0, 0.005))
    failure = kill()
    stop.set()
    await asyncio.gather(*publishers)
    workload.crashed()
    return failure


def kill_writer(served: Served) -> str | None:
    """SIGKILL the relay (with workers: the writer, whose workers must then exit on their own, as nothing
    they take could be committed); None, or the failure: a process of the relay left running."""
    served.kill()
    if not served.new_session:
        return None
    deadline = time.monotonic() + START_TIMEOUT
    while (left := served.group()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)  # leave no stray process behind a failing run
    return f"processes {left} still running {START_TIMEOUT} s after the writer was killed" if left else None


async def worker_restarted(served: Served, victim: int, workers: int, restarts: int) -> str | None:
    """Wait (bounded) until a worker replaces `victim` and listens: `workers + restarts` worker_started log
    lines in all; None, or the failure."""
    def listening() -> bool:
        started = sum(e.get("event") == "worker_started" for e in served.log_events())
        return started == workers + restarts and victim not in served.children()

    if await eventually(listening, timeout=START_TIMEOUT, every=0.05):
        return None
    return f"worker {victim} was not replaced within {START_TIMEOUT} s:\n{served.stderr[-3000:]}"


async def run(workdir: Path, kills: int, seed: int = 1, connections: int = 4, answers_per_kill: int = 300,
              real: list[dict] | None = None, progress: Callable[[CrashReport], None] | None = None,
              workers: int = 0) -> CrashReport:
    """Kill and restart a relay `kills` times while `connections` clients publish; check after every restart.

    Each publishing cycle is killed after a random number (1 to `answers_per_kill`) of OK replies.  With
    `workers` > 0 (`relay serve --workers N`) the cycles after each start kill a random worker first (the
    relay restarts it and is checked while it keeps running; clients reconnect), then the writer (the whole
    relay goes down, and is restarted); start-up kills (of the writer) come only after a first worker kill.
    Stops at the first failing check (the database is left in `workdir`).  `progress(report)` runs after
    each check.
    """
    started = time.monotonic()
    config_path, db = workdir / "relay.toml", workdir / "relay.db"
    workload = Workload(seed, real_events() if real is None else real)
    rng, report, revision = random.Random(seed), CrashReport(), 1
    while report.kills <= kills and not report.failures:
        if report.kills == 0 or rng.random() < REVISION_CHANGE_ODDS:
            revision = 3 - revision if report.kills else revision
            config_path.write_text(config_text(revision), encoding="utf-8")
            config = load_config(config_path, {}, {"store": {"path": str(db)}})
            report.revisions += bool(report.kills)
        with Served(workdir, "--config", config_path, "--db", db, "--port", 0, "--workers", workers,
                    new_session=workers > 0) as served:
            if (report.kills < kills and (report.worker_kills or not workers)
                    and rng.random() < STARTUP_KILL_ODDS):
                await asyncio.sleep(rng.uniform(0.0, 2.0))  # imports take about 1 s; set-up follows
                if served.proc.poll() is not None:
                    report.failures = [f"relay exited during start-up with {served.proc.returncode}:\n"
                                       f"{served.stderr[-3000:]}"]
                    break
                failure = kill_writer(served)
                report.failures = [failure] if failure else []
                report.kills += 1
                report.startup_kills += 1
                continue
            try:
                url = served.started_url()
            except AssertionError as exc:  # it exited or never said it started
                report.failures = [str(exc)[-3000:]]
                break
            restarts = 0  # workers replaced since this start
            while True:
                report.served, report.failures = await check_relay(url, config, workload)
                report.checks += 1
                report.record(workload, started)
                if progress is not None:
                    progress(report)
                if report.kills == kills or report.failures:
                    break
                report.kills += 1
                victim = rng.choice(served.children()) if workers and not restarts else None
                failure = await publish_then_kill(
                    url, workload, rng, connections, answers_per_kill,
                    lambda: kill_writer(served) if victim is None else os.kill(victim, signal.SIGKILL))
                if victim is None:
                    report.failures = [failure] if failure else []
                    break
                report.worker_kills += 1
                restarts += 1
                if failure := await worker_restarted(served, victim, workers, restarts):
                    report.failures = [failure]
                    break
            if served.proc.poll() is None:
                break  # the last check ran (and passed or failed) with the relay up: no restart follows
    report.record(workload, started)
    return report
