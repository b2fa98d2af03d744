"""`relay import` and `relay export`: JSONL into and out of the store.

Each imported line goes through ingest as `IMPORT` (relay/ingest/source.py): shape,
id, BIP-340 signature, the event rules and the `[auth]` kind rules, not who
may publish (the operator imports), then the same writer, so the outcome
counts are those a client would have been told in its OK replies.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from relay.config import Config
from relay.ingest import IMPORT, Ingest, Outcome
from relay.ingest.outcome import EPHEMERAL, NEWER_VERSION
from relay.node import open_store
from relay.protocol.envelopes import loads
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
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


async def run_import(config: Config, path: Path) -> int:
    """`relay import FILE`: prints stored / duplicate / older version / ephemeral / rejected counts
    (see `ImportReport`) and each rejection's message with its count; exit 0, or 2 if FILE cannot be opened."""
    console = Console(stderr=True)
    try:
        source = sys.stdin.buffer if str(path) == "-" else path.open("rb")
    except OSError as exc:
        console.print(f"relay import: {exc}")
        return 2
    store = await open_store(config, read_connections=1)
    ingest = Ingest.from_config(config, store)
    try:
        with source:
            total = None if source is sys.stdin.buffer else sum(1 for _ in path.open("rb"))
            with Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                          console=console, disable=not console.is_terminal) as bar:
                task = bar.add_task("import", total=total)
                report = await import_lines(ingest, source, lambda n: bar.advance(task, n))
    finally:
        await ingest.aclose()
        await store.close()
    print(f"read {report.total}: stored {report.stored}, duplicate {report.duplicate}, "
          f"older version (not stored) {report.older_version}, ephemeral (not stored) {report.ephemeral}, "
          f"rejected {sum(report.rejected.values())}")
    for message, count in report.rejected.most_common():
        print(f"  rejected {count}: {message}")
    return 0


async def run_export(config: Config, filter_json: str, output: Path | None) -> int:
    """`relay export [--filter JSON]`: every matching live event as one JSON line, newest first."""
    try:
        f = parse_filter(loads(filter_json))
    except Rejection as exc:
        print(f"relay export: bad --filter: {exc}", file=sys.stderr)
        return 2
    if not Path(config.store.path).exists():
        print(f"relay export: no database at {config.store.path}", file=sys.stderr)
        return 2
    store = await Store.open(config.store.path, config.store.options(read_connections=1))
    try:
        out = output.open("wb") if output else sys.stdout.buffer
        with out:
            async for raw in store.scan(f):
                out.write(raw + b"\n")
    finally:
        await store.close()
    return 0
