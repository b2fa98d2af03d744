"""`relay import`: JSONL into the store.

Each line goes through ingest as `IMPORT` (relay/ingest/source.py): shape,
id, BIP-340 signature, the event rules and the `[auth]` kind rules, not who
may publish (the operator imports), then the same writer, so the outcome
counts are those a client would have been told in its OK replies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.ingest import IMPORT, Ingest, Outcome
from relay.ingest.outcome import EPHEMERAL, NEWER_VERSION

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

    def add(self, outcome: Outcome) -> None:
        """Count one line's outcome."""
        if outcome == NEWER_VERSION:
            self.older_version += 1
        elif outcome == EPHEMERAL:
            self.ephemeral += 1
        elif not outcome.accepted:
            self.rejected[outcome.message] += 1
        elif outcome.prefix == "duplicate":
            self.duplicate += 1
        else:
            self.stored += 1


async def import_lines(ingest: Ingest, lines: Iterable[bytes], progress=None) -> ImportReport:
    """Take each non-blank JSONL line (one event object per line) through `ingest` as `IMPORT`.

    Lines go in chunks of `CHUNK_LINES`, whose signatures are checked together
    on the ingest's pool; `progress(n)` is called with the number of lines
    done after each chunk.
    """
    report = ImportReport()
    chunk: list[bytes] = []
    for line in lines:
        if line.strip():
            chunk.append(line)
        if len(chunk) >= CHUNK_LINES:
            await _import_chunk(ingest, chunk, report, progress)
            chunk = []
    if chunk:
        await _import_chunk(ingest, chunk, report, progress)
    return report


async def _import_chunk(ingest: Ingest, chunk: list[bytes], report: ImportReport, progress) -> None:
    for outcome, _ in await ingest.accept_many(chunk, IMPORT):
        report.add(outcome)
    progress and progress(len(chunk))
