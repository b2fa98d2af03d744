"""`relay sync ws://PEER`: one reconciliation with a peer, with progress on a terminal and a summary."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from relay.commands import check_database_path
from relay.commands.interrupt import EXIT_INTERRUPTED, interruptible
from relay.commands.through import open_write_path
from relay.config import MIN_FRAME_SIZE_LIMIT, Config
from relay.keys import NodeKeyError
from relay.protocol.envelopes import loads
from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.sync.peer import PeerConnection, PeerError
from relay.sync.scheduler import max_frame_bytes, node_key, sync_options
from relay.sync.session import DIRECTIONS, Intake, SyncOptions, SyncReport, sync_with_peer
from relay.sync.state import LeaseBusy, LeaseLost, PeerStates, new_owner

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def parse_sync_filter(filter_json: str) -> dict:
    """The `--filter` JSON as a filter object, checked like a REQ filter.

    Raises:
        ValueError: not a valid NIP-01 filter, or it has a `limit` or a NIP-50 `search` (meaningless for sync).
    """
    try:
        obj = loads(filter_json)
        parsed = parse_filter(obj)
        if parsed.limit is not None:
            raise ValueError("limit has no meaning for sync")
        if parsed.search is not None:
            raise ValueError("search has no meaning for sync (NIP-77 cannot reconcile it)")
    except Rejection as exc:
        raise ValueError(str(exc)) from None
    return obj


async def sync_once(config: Config, url: str, filter_obj: dict, options: SyncOptions,
                    progress=None, report: SyncReport | None = None) -> SyncReport:
    """Reconcile the local store with the peer at `url` once: fetch and/or push per `options.direction`.

    Opens the store of `config`, takes the peer's lease (as configured peers
    do), records the outcome in `sync_peers`, and closes everything.  The
    counts go to `report` if given (it then holds what was done before a failure).

    Raises:
        PeerError: the peer lacks NIP-77, answered NOTICE, refused AUTH, timed out or went away.
        LeaseBusy: another process is syncing this peer on the same database.
        NodeKeyError: the node key file cannot be created or read.
    """
    # Through the running relay if one serves it; else a bulk load (a first sync fetches a whole backlog).
    path = await open_write_path(config, read_connections=2, bulk=True)
    try:
        key = node_key(config)  # after the database is known good: a refused one gets no key file beside it
    except BaseException:
        await path.close()
        raise
    store = path.store
    states = await PeerStates.open(config.store.path)
    ingest = await path.ingest(config)  # bans
    report = SyncReport() if report is None else report
    try:
        async with states.hold(url, new_owner(), config.sync.lease_seconds):
            await states.record_attempt(url)
            started = time.monotonic()
            try:
                conn = await PeerConnection.open(url, key, config.sync.connect_timeout_seconds,
                                                 config.sync.timeout_seconds,
                                                 max_frame_bytes(config, options.frame_size_limit))
                try:
                    await sync_with_peer(conn, store, filter_obj, options, Intake(ingest, url), report, progress)
                finally:
                    await conn.close()
            except PeerError as exc:
                report.seconds = time.monotonic() - started  # connecting included: it may be what failed
                await states.record_error(url, str(exc))
                await states.add_counts(url, report.fetched, report.pushed)
                raise
            await states.add_counts(url, report.fetched, report.pushed)
            await states.record_run(url, sum(report.refused.values()), report.error_text())
    finally:
        await ingest.aclose()
        await states.close()
        await path.close()
    return report


class _Display:
    """Rich progress bars for reconciliation rounds, fetched and pushed events (terminal only)."""

    def __init__(self, console: Console, direction: str) -> None:
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            console=console, disable=not console.is_terminal, transient=False)
        self.rounds = self.bar.add_task("reconcile: rounds", total=None)
        self.fetch = self.bar.add_task("fetch: events", total=None, visible=direction != "up")
        self.push = self.bar.add_task("push: events", total=None, visible=direction != "down")

    def __call__(self, report: SyncReport) -> None:
        self.bar.update(self.rounds, completed=report.rounds)
        self.bar.update(self.fetch, total=report.need, completed=report.fetch_done)
        self.bar.update(self.push, total=report.have, completed=report.push_done)


def print_report(url: str, direction: str, report: SyncReport) -> None:
    """The summary on stdout: one line of counts, then one line per settled, refused or error message, the
    last two followed by their first event ids."""
    print(f"sync {url} ({direction}): {report.summary()}")
    for message, count in report.settled.most_common():
        print(f"  settled {count}: {message}")
    for what, counts in (("refused", report.refused), ("error", report.errors)):
        for message, count in counts.most_common():
            print(f"  {what} {count}: {message}")
            ids = report.ids.get(message, [])
            print(f"    ids {', '.join(ids)}{', ...' if count > len(ids) else ''}" if ids else "    ids unknown")


async def run_sync(config: Config, url: str, filter_json: str, direction: str, frame_size: int | None,
                   create: bool = False) -> int:
    """`relay sync URL`: exit 0 when in sync (events the peer refused for good are settled, listed), 1 when the
    peer failed us or events errored (`sync_peers.last_error` says so too), 2 on bad arguments or a database
    that does not exist (without `create`: `check_database_path`), 130 when interrupted (SIGINT), after the
    summary of what was done."""
    check_database_path(config, create)
    err = Console(stderr=True)
    if not url.startswith(("ws://", "wss://")):
        print(f"relay sync: not a ws:// or wss:// URL: {url!r}", file=sys.stderr)
        return EXIT_USAGE
    if direction not in DIRECTIONS:
        print(f"relay sync: --dir must be one of {', '.join(DIRECTIONS)}", file=sys.stderr)
        return EXIT_USAGE
    if frame_size is not None and frame_size < MIN_FRAME_SIZE_LIMIT:
        print(f"relay sync: --frame-size must be at least {MIN_FRAME_SIZE_LIMIT} bytes", file=sys.stderr)
        return EXIT_USAGE
    try:
        filter_obj = parse_sync_filter(filter_json)
    except ValueError as exc:
        print(f"relay sync: bad --filter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    url = url.rstrip("/") if url.count("/") <= 3 else url
    options = sync_options(config, direction, frame_size)
    display = _Display(err, direction)
    report = SyncReport()
    try:
        with display.bar:
            interrupted = await interruptible(sync_once(config, url, filter_obj, options, display, report))
    except (PeerError, LeaseBusy, LeaseLost, NodeKeyError) as exc:
        print_report(url, direction, report)  # what was done before the failure
        print(f"relay sync: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print_report(url, direction, report)
    if interrupted:
        print("relay sync: interrupted; the summary counts what was done", file=sys.stderr)
        return EXIT_INTERRUPTED
    if report.errors:
        print(f"relay sync: finished with {sum(report.errors.values())} errors (see above)", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
