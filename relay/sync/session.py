"""One reconciliation with a peer: NIP-77 over the local store's items, then fetch and push.

How this works
--------------
`sync_with_peer` reads the (created_at, id) items of the live events
matching the filter into a `SortedVector`, and runs the negentropy engine
as initiator over an open `PeerConnection`.  Each round reports ids only
we hold (have) and ids only the peer holds (need); with a frame size
limit the same id can be reported twice, so both are de-duplicated here.
Needed ids are fetched while reconciliation goes on, in REQs of
`fetch_batch` ids, at most `fetch_in_flight` at once; each batch goes
through ingest as the peer's (`Intake`: relay/ingest/, stored with origin
= the peer's URL).  Once everything is fetched, the events the peer lacks
are read from the store by id (a superseded or deleted one is no longer
there) and sent with EVENT, at most `push_in_flight` waiting for their OK.
Fetching first means an older version we hold is not pushed when the
peer's newer one has just replaced it here.

A needed event refused here because we hold a newer version that was
deleted (docs/architecture.md, invariant 5) would stay a difference for ever: last
(direction both: the older version is seen by fetching it, and answered by
pushing), the deletion and the deleted version are sent to the peer
(relay/store/evidence.py), which then drops its older version too.

Replies that mean "the peer (or we) already settled this" are not errors
(`classify` for the peer's OK messages, `classify_outcome` for ours):
duplicates, a newer version held, a deleted or expired event, strfry's
`replaced:`, an id the peer no longer serves, an event or author banned
here, a refusal by a write policy or NIP-70 (`Outcome.settles`).  Needed
ids that retention evicted here, that are banned here, or that a write
policy refused from a peer, are settled without being fetched.  An event
the peer refuses for good (`invalid:`, `blocked:`, ...: strfry's "too many
tags") is settled as refused, counted and named, not an error that would
fail every run; errors are what may pass (`rate-limited:`, `error:`, no reason).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from relay.ingest import Ingest, Outcome, Source
from relay.ingest.outcome import BANNED, DELETED, DUPLICATE, EPHEMERAL, EVICTED, EXPIRED, NEWER_VERSION, VANISHED
from relay.protocol.event import RAW_ID, Event, event_ref
from relay.protocol.filters import Filter, parse_filter
from relay.protocol.information import keeps_deletion_marks
from relay.protocol.negentropy import Negentropy, SortedVector
from relay.protocol.rejection import invalid
from relay.store import evidence
from relay.store.batch import coordinate_of
from relay.store.refused import refused_among
from relay.store.retention import evicted_among
from relay.store.store import Store
from relay.sync.peer import PeerConnection, PeerError

log = structlog.get_logger(__name__)

DIRECTIONS = ("down", "up", "both")
STORED, SETTLED, REFUSED, ERROR = "stored", "settled", "refused", "error"
PERMANENT = ("invalid:", "blocked:", "pow:", "restricted:", "mute:")
"""NIP-01 prefixes of a peer's refusal that sending the same event again cannot change."""
SHOWN_IDS = 5  # event ids kept per refusal or error message
NOT_SENT = "not sent: the peer is not this relay software (NIP-11), which keeps deleted versions' marks"
MISSING = "missing: the peer did not serve it (expired or deleted there?)"
GONE_LOCALLY = "gone: no longer stored here (superseded, deleted or expired)"
EVICTED_HERE = "evicted: removed here by retention, not fetched back"
REFUSED_HERE = "refused: a write policy refused it here, not fetched again"
SETTLED_HERE = frozenset({DUPLICATE, NEWER_VERSION, DELETED, VANISHED, EVICTED, EXPIRED, EPHEMERAL, BANNED})
"""Our own outcomes that settle a fetched event: held here already, or never to be."""
LASTING_CAP = 10_000  # differences remembered from one run to the next (a catch-up run has more: not compared)


@dataclass(frozen=True)
class SyncOptions:
    """How one reconciliation runs: direction, bytes per frame, counts of ids and events.

    `scheduler.sync_options` builds it from `[sync]`, where the defaults and
    rules are (relay/config.py `SyncConfig`).
    """

    direction: str
    frame_size_limit: int
    fetch_batch: int
    fetch_in_flight: int
    push_in_flight: int


@dataclass
class SyncReport:
    """Counts of one sync: distinct ids in `have` (only we hold) and `need` (only the peer holds),
    events `fetched` (stored here) and `pushed` (accepted there), and by message, refusals that
    are `settled`, events the peer `refused` for good, and real `errors`; `ids` holds the first
    SHOWN_IDS event ids of each refused or error message."""

    local_items: int = 0
    rounds: int = 0
    have: int = 0
    need: int = 0
    fetched: int = 0
    pushed: int = 0
    settled: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    ids: dict[str, list[str]] = field(default_factory=dict)
    evidence: Counter = field(default_factory=Counter)  # deleted newest versions sent to the peer, by its answer
    seconds: float = 0.0
    reported: int = 0  # have + need ids as reported by the rounds, repeats included
    differences: frozenset[bytes] | None = None  # the have and need ids of a finished run, up to LASTING_CAP
    fetch_done: int = 0  # needed ids settled one way or another (for progress)
    push_done: int = 0  # had ids settled one way or another (for progress)

    def count(self, outcome: str, message: str, up: bool, event_id: object = None) -> None:
        """Count one `classify` outcome of a fetch (`up` False) or a push (`up` True) of `event_id`."""
        if up:
            self.push_done += 1
        else:
            self.fetch_done += 1
        if outcome == STORED:
            if up:
                self.pushed += 1
            else:
                self.fetched += 1
        elif outcome == SETTLED:
            self.settled[message] += 1
        else:
            (self.refused if outcome == REFUSED else self.errors)[message] += 1
            shown = self.ids.setdefault(message, [])
            if type(event_id) is str and len(shown) < SHOWN_IDS:
                shown.append(event_id)

    def as_dict(self) -> dict:
        """The counts as a JSON-ready dict."""
        return {"local_items": self.local_items, "rounds": self.rounds, "reported": self.reported,
                "have": self.have, "need": self.need,
                "fetched": self.fetched, "pushed": self.pushed, "settled": dict(self.settled),
                "refused": dict(self.refused), "errors": dict(self.errors), "ids": self.ids,
                "evidence": dict(self.evidence), "seconds": round(self.seconds, 3)}

    def summary(self) -> str:
        """One line: have, need, fetched, pushed, settled, errors, then refused (by the peer, for good) and
        deleted versions sent when there are any."""
        sent = sum(n for answer, n in self.evidence.items() if answer != NOT_SENT)
        refused = sum(self.refused.values())
        extra = (f", refused {refused}" if refused else "") + (f", deleted versions sent {sent}" if sent else "")
        return (f"have {self.have}, need {self.need}, fetched {self.fetched}, pushed {self.pushed}, "
                f"settled {sum(self.settled.values())}, errors {sum(self.errors.values())}{extra} "
                f"({self.rounds} rounds, {self.seconds:.1f} s)")

    def error_text(self) -> str | None:
        """What `sync_peers.last_error` says of a run whose events errored (None: none did)."""
        if not self.errors:
            return None
        message, count = self.errors.most_common(1)[0]
        return (f"{sum(self.errors.values())} events not synced for now, {count} of them: {message} "
                f"(e.g. {', '.join(self.ids.get(message, [])) or 'no id'})")


def classify(accepted: bool, message: str) -> tuple[str, str]:
    """(STORED | SETTLED | REFUSED | ERROR, message) for one NIP-01 OK answer of a peer (ours: `classify_outcome`).

    Settled: `OK true` with "duplicate:", `OK false` with "duplicate:" (e.g.
    "duplicate: have a newer version"), "blocked:" for a deleted event, a
    refusal of an expired event ("invalid: event has expired" is ours,
    "blocked: event is expired" nostr-sdk's), and strfry's "replaced:".
    Refused: any other `PERMANENT` prefix (the peer will never take it).
    """
    if accepted:
        return (SETTLED, message) if message.startswith("duplicate:") else (STORED, message)
    lower = message.lower()
    if lower.startswith(("duplicate:", "replaced:")):
        return SETTLED, message
    if lower.startswith("blocked:") and "delet" in lower:
        return SETTLED, message
    if lower.startswith(("invalid:", "blocked:")) and "expired" in lower:
        return SETTLED, message
    if lower.startswith(PERMANENT):
        return REFUSED, message
    return ERROR, message or "refused without a reason"


def classify_outcome(outcome: Outcome) -> tuple[str, str]:
    """(STORED | SETTLED | ERROR, message) for ingest's outcome of one event from a peer (`SETTLED_HERE`)."""
    if outcome in SETTLED_HERE or outcome.settles:
        return SETTLED, outcome.message
    return (STORED, outcome.message) if outcome.accepted else (ERROR, outcome.message)


class Intake:
    """Takes events from one peer through ingest, as that peer's (`Source.peer`: origin = its URL)."""

    def __init__(self, ingest: Ingest, url: str) -> None:
        self.ingest = ingest
        self.store = ingest.store
        self.source = Source.peer(url)

    async def accept(self, objects: list[object], screen: Callable[[Event], None],
                     older: list[Event] | None = None) -> list[tuple[str, str]]:
        """Validate and store `objects`; one `classify_outcome` each, in order.

        `screen(event)` raises a `Rejection` for an event the peer should not
        have sent (not requested, outside the filter), an error.
        Events refused because a newer version is held are appended to `older`.
        """
        answers = await self.ingest.accept_many(objects, self.source, screen)
        if older is not None:
            older += [event for outcome, event in answers if outcome == NEWER_VERSION]
        return [classify_outcome(outcome) for outcome, _ in answers]


async def sync_with_peer(conn: PeerConnection, store: Store, filter_obj: dict, options: SyncOptions,
                         intake: Intake, report: SyncReport | None = None,
                         progress: Callable[[SyncReport], None] | None = None) -> SyncReport:
    """Reconcile the events matching `filter_obj` with the peer, then fetch and/or push per `options.direction`.

    `filter_obj` is a NIP-01 filter (JSON object, no `limit`); counts go
    into `report` (a new one if None), and `progress(report)` is called as
    they change.

    Raises:
        PeerError: the peer lacks NIP-77, answered NOTICE, refused, timed out or went away.
    """
    report = report or SyncReport()
    progress = progress or (lambda r: None)
    started = time.monotonic()
    down, up = options.direction in ("down", "both"), options.direction in ("up", "both")
    items = await store.items(parse_filter(filter_obj))
    report.local_items = len(items)
    neg = Negentropy(SortedVector.from_rows(items), options.frame_size_limit)
    del items
    seen_have: set[bytes] = set()
    seen_need: set[bytes] = set()
    to_push: list[bytes] = []
    fetch = _Fetcher(conn, intake, options, report, progress)

    def on_round(have: list[bytes], need: list[bytes]) -> None:
        report.rounds += 1
        report.reported += len(have) + len(need)
        for id_ in have:
            if id_ not in seen_have:
                seen_have.add(id_)
                if up:
                    to_push.append(id_)
        for id_ in need:
            if id_ not in seen_need:
                seen_need.add(id_)
                if down:
                    fetch.add(id_)
        report.have, report.need = len(seen_have), len(seen_need)
        fetch.raise_failure()
        progress(report)

    try:
        try:
            await conn.reconcile(filter_obj, neg, on_round)
            if len(seen_have) + len(seen_need) <= LASTING_CAP:
                report.differences = frozenset(seen_have | seen_need)
            await fetch.finish()
        finally:
            fetch.cancel()
        if up:
            await _push(conn, store, to_push, options, report, progress)
            await _send_evidence(conn, store, fetch.older, report)
    finally:  # a failed run's summary tells how long it ran too
        report.seconds = time.monotonic() - started
    progress(report)
    return report


class _Fetcher:
    """Needed ids in REQ batches of `fetch_batch`, at most `fetch_in_flight` REQs at once."""

    def __init__(self, conn: PeerConnection, intake: Intake, options: SyncOptions, report: SyncReport,
                 progress: Callable[[SyncReport], None]) -> None:
        self.conn, self.intake, self.options, self.report, self.progress = conn, intake, options, report, progress
        self.pending: list[str] = []
        self.tasks: list[asyncio.Task] = []
        self.slots = asyncio.Semaphore(options.fetch_in_flight)  # REQs awaiting EOSE
        self.storing = asyncio.Semaphore(2)  # batches being validated and stored: bounds memory, lets REQs overlap
        self.older: list[Event] = []  # fetched versions refused here: a newer one is held

    def add(self, id_: bytes) -> None:
        """Queue one needed id; a full batch starts its REQ."""
        self.pending.append(id_.hex())
        if len(self.pending) >= self.options.fetch_batch:
            self._launch()

    def _launch(self) -> None:
        batch, self.pending = self.pending, []
        self.tasks.append(asyncio.create_task(self._fetch(batch)))

    async def _fetch(self, ids: list[str]) -> None:
        # retention removed them here, or a policy refused them: never fetched again (relay/store/retention.py,
        # relay/store/refused.py)
        for among, why in ((evicted_among, EVICTED_HERE), (refused_among, REFUSED_HERE)):
            settled = await self.intake.store.read_snapshot(among, [bytes.fromhex(i) for i in ids])
            if settled:
                ids = [i for i in ids if bytes.fromhex(i) not in settled]
                self.report.settled[why] += len(settled)
                self.report.fetch_done += len(settled)
        moderation = self.intake.ingest.moderation
        if moderation is not None and (banned := [i for i in ids if moderation.is_banned_event(i)]):
            ids = [i for i in ids if i not in banned]  # settled like a tombstone: never fetched back
            self.report.settled[BANNED.message] += len(banned)
            self.report.fetch_done += len(banned)
        wanted = set(ids)

        def asked_for(event: Event) -> None:
            if event.id not in wanted:
                raise invalid("the peer sent an event that was not asked for")
            wanted.discard(event.id)  # a second copy is not stored twice

        remaining = ids
        while remaining:
            async with self.slots:
                objects = await self.conn.fetch(remaining)
            before = len(wanted)
            async with self.storing:
                for obj, (outcome, message) in zip(objects, await self.intake.accept(objects, asked_for, self.older)):
                    self.report.count(outcome, message, False, event_ref(obj))
            self.progress(self.report)
            # A peer whose max limit is below our batch serves part of it: ask again for the rest,
            # until a REQ brings nothing new (what is left is not served there).
            if len(wanted) == before:
                break
            remaining = [i for i in remaining if i in wanted]
        if wanted:
            self.report.settled[MISSING] += len(wanted)
            self.report.fetch_done += len(wanted)
            self.progress(self.report)

    def raise_failure(self) -> None:
        """Re-raise the error of a failed fetch, if any (stops the reconciliation early)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()

    async def finish(self) -> None:
        """Fetch the last partial batch and wait for every fetch; raises the first failure."""
        if self.pending:
            self._launch()
        await asyncio.gather(*self.tasks)

    def cancel(self) -> None:
        """Stop the fetches still running (after a failure)."""
        for task in self.tasks:
            task.cancel()


async def _send_evidence(conn: PeerConnection, store: Store, older: list[Event], report: SyncReport) -> None:
    """For the versions the peer offered that lose to a deleted newer one here: send the deletion, then, once
    the peer has it, the deleted version, so the peer's mark rises to it as ours did (relay/store/evidence.py).

    Only to a peer whose NIP-11 document names this project's software: another relay might store the deleted
    version and serve it (rust-nostr's LocalRelay does); there the difference lasts, and is counted as such.
    """
    coordinates = [coordinate_of(e, bytes.fromhex(e.pubkey)) for e in older]
    pairs = await store.read_snapshot(evidence.select, coordinates) if older else []
    if not pairs:
        return
    if not keeps_deletion_marks(await conn.information()):  # it might store the deleted version and serve it
        report.evidence[NOT_SENT] += len(pairs)
        return
    deletions = {raw[RAW_ID].decode(): raw for raw, _ in pairs}
    answers: dict[str, tuple[bool, str]] = {}
    await conn.publish_many(list(deletions.items()), lambda i, accepted, message: answers.__setitem__(
        i, (accepted, message)))
    held = {i for i, (accepted, message) in answers.items() if classify(accepted, message)[0] != ERROR}
    versions = [(raw[RAW_ID].decode(), raw) for deletion, raw in pairs if deletion[RAW_ID].decode() in held]

    def on_answer(event_id: str, accepted: bool, message: str) -> None:
        report.evidence[classify(accepted, message)[1]] += 1

    await conn.publish_many(versions, on_answer)


def push_chunk(push_in_flight: int) -> int:
    """Events per `publish_many` write: `push_in_flight` is spread over several writes for overlap."""
    return max(1, min(50, push_in_flight // 4))


async def _push(conn: PeerConnection, store: Store, ids: list[bytes], options: SyncOptions,
                report: SyncReport, progress: Callable[[SyncReport], None]) -> None:
    """Send the stored events among `ids` with EVENT, at most `push_in_flight` awaiting OK."""
    chunk = push_chunk(options.push_in_flight)
    slots = asyncio.Semaphore(max(1, options.push_in_flight // chunk))
    tasks: set[asyncio.Task] = set()
    failures: list[BaseException] = []

    def on_answer(event_id: str, accepted: bool, message: str) -> None:
        report.count(*classify(accepted, message), True, event_id)

    async def push_chunk_of(raws: list[bytes]) -> None:
        try:
            # Counted per answer: a chunk cut short by a lost connection still counts what the peer took.
            await conn.publish_many([(raw[RAW_ID].decode(), raw) for raw in raws], on_answer)
            progress(report)
        except PeerError as exc:
            failures.append(exc)
        finally:
            slots.release()

    try:
        for start in range(0, len(ids), options.fetch_batch):
            batch = ids[start:start + options.fetch_batch]
            raws = await store.query([Filter(ids=frozenset(i.hex() for i in batch))], len(batch), len(batch))
            if len(raws) < len(batch):
                report.settled[GONE_LOCALLY] += len(batch) - len(raws)
                report.push_done += len(batch) - len(raws)
            for offset in range(0, len(raws), chunk):
                await slots.acquire()
                if failures:
                    raise failures[0]
                task = asyncio.create_task(push_chunk_of(raws[offset:offset + chunk]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        if failures:
            raise failures[0]
    finally:
        for task in tasks:
            task.cancel()


__all__ = ["DIRECTIONS", "Intake", "PeerError", "SyncOptions", "SyncReport", "classify", "classify_outcome",
           "sync_with_peer"]
