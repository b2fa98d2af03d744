"""Bodies of the offline subcommands (`import`, `export`), each opening the store itself."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from relay.config import Config
from relay.ingest import Ingest
from relay.node import open_store
from relay.protocol.envelopes import loads
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.store.store import Store
from relay.transfer import import_lines


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
        ingest.close()
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
