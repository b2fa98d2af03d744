"""`relay import`: JSONL into the store.

Import validates every line exactly as a client's EVENT (shape, id, BIP-340
signature, the event rules, the `[auth]` kind rules; not who may publish: the
operator imports) and writes through the same writer, so the outcome counts
are those a client would have been told in its OK replies.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from relay.protocol.envelopes import loads
from relay.protocol.event import Event, EventLimits, is_ephemeral, parse_event, verify_signature
from relay.protocol import rules
from relay.protocol.rejection import Rejection
from relay.store.batch import NEWER_VERSION
from relay.store.store import Store

CHUNK_LINES = 2_000


@dataclass
class ImportReport:
    """Counts of one import, in lines: stored, duplicates, older versions, ephemeral, refusals by message.

    `stored` also counts a line stored, then superseded or deleted by a later
    line; `duplicate` an id already held; `older_version` a replaceable or
    addressable version that loses to the one held (NIP-01: older, or as old
    with a higher id), which a client is told with OK false "duplicate: have
    a newer version": not stored, like `ephemeral`, but not a refusal.
    """

    stored: int = 0
    duplicate: int = 0
    older_version: int = 0
    ephemeral: int = 0
    rejected: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        """Lines read."""
        return self.stored + self.duplicate + self.older_version + self.ephemeral + sum(self.rejected.values())

    def add(self, accepted: bool, message: str) -> None:
        """Count one (accepted, message) outcome of the NIP-01 OK reply."""
        if (accepted, message) == NEWER_VERSION:
            self.older_version += 1
        elif not accepted:
            self.rejected[message] += 1
        elif message.startswith("duplicate:"):
            self.duplicate += 1
        else:
            self.stored += 1


def _parse_line(line: bytes, limits: EventLimits, now: float, check_kind: Callable[[int], None] | None) -> Event:
    event = parse_event(loads(line), limits, now)
    rules.check_event(event, now)
    if check_kind is not None:
        check_kind(event.kind)
    return event


def _verified(events: list[Event]) -> list[bool]:
    return [verify_signature(e) for e in events]


async def import_lines(store: Store, lines: Iterable[bytes], limits: EventLimits, threads: int = 2,
                       progress=None, check_kind: Callable[[int], None] | None = None) -> ImportReport:
    """Validate and store each non-blank JSONL line (one event object per line).

    `progress(n)` is called with the number of lines done after each chunk; `check_kind(kind)` raises
    a Rejection for a kind not accepted (`AccessPolicy.check_kind`; None: every kind).
    """
    report = ImportReport()
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(threads) as pool:
        chunk: list[bytes] = []
        for line in lines:
            if line.strip():
                chunk.append(line)
            if len(chunk) >= CHUNK_LINES:
                await _import_chunk(store, chunk, limits, check_kind, loop, pool, threads, report)
                progress and progress(len(chunk))
                chunk = []
        if chunk:
            await _import_chunk(store, chunk, limits, check_kind, loop, pool, threads, report)
            progress and progress(len(chunk))
    return report


async def _import_chunk(store, chunk, limits, check_kind, loop, pool, threads, report) -> None:
    now = time.time()
    events: list[Event] = []
    for line in chunk:
        try:
            events.append(_parse_line(line, limits, now, check_kind))
        except Rejection as rejection:
            report.add(False, str(rejection))
    size = max(1, -(-len(events) // threads))
    parts = [events[i:i + size] for i in range(0, len(events), size)]
    checks = await asyncio.gather(*[loop.run_in_executor(pool, _verified, part) for part in parts])
    valid = []
    for event, ok in zip(events, (ok for part in checks for ok in part)):
        if not ok:
            report.add(False, "invalid: bad signature")
        elif is_ephemeral(event.kind):
            report.ephemeral += 1
        else:
            valid.append(event)
    for accepted, message in await asyncio.gather(*[store.submit(e) for e in valid]):
        report.add(accepted, message)

