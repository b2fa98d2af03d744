"""Bodies of the projector subcommands: `verify`, `projectors list | rebuild NAME | refusals`, `query TABLE`.

They work on the database file directly with the stdlib `sqlite3` module:
read-only (`mode=ro`) for everything but `projectors rebuild`, so they can
run beside `relay serve` (WAL readers never block the writer).
"""

from __future__ import annotations

import csv
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass

import orjson

from relay.commands import SERVED_DATABASE_HINT, open_readonly, utc_time
from relay.commands.search import check_search, print_search_check
from relay.config import Config
from relay.hooks import negentropy_hook
from relay.store import db
from relay.store.location import require_database
from relay.store.negentropy import IndexCheck, NegentropyIndex, verify_index
from relay.store.projectors.engine import force_rebuild
from relay.store.projectors.tables import build_progress, ensure_store_tables, quote, read_meta, table_exists
from relay.store.projectors.verify import verify
from relay.store.records import Page, RecordQueryError, TableView, views
from relay.status import has_refusal_log, projector_states, recent_refusals

SHOWN_PER_KIND = 10  # keys listed per table and per kind of problem
BUILDING_EXIT = 3  # `relay verify` and `relay query`: a projector is being built (relay/store/projectors/build.py)


def run_verify(config: Config) -> int:
    """`relay verify`: recompute every projected table, the negentropy index and the search index from the events
    and compare.

    Prints one line per table ("ok" or counts of missing, orphan and
    mismatched rows, with up to 10 keys of each; "building (n of N events)"
    for a projector being built, not checked), then one per indexed filter,
    then one for the search index, and returns 0 when everything agrees, 1
    when anything does not, 2 when there is no database, and
    BUILDING_EXIT (3) when everything checked agrees but a projector is still being built.
    """
    conn = open_readonly(config.store.path, "verify")
    if conn is None:
        return 2
    with closing(conn):
        building = {s.name: p for s in config.projectors if (p := build_progress(conn, s.name)) is not None}
        checks = verify(conn, [s for s in config.projectors if s.name not in building])
        refused = dict(conn.execute("SELECT projector, count(*) FROM projector_refusals GROUP BY projector")
                       .fetchall()) if has_refusal_log(conn) else {}
        removed = [name for name in read_meta(conn) if name not in {s.name for s in config.projectors}]
        hook = negentropy_hook(config)  # the indexes this configuration keeps (none when disabled)
        index_checks = verify_index(conn, hook.specs if isinstance(hook, NegentropyIndex) else [])
        search_check = check_search(conn, config)  # NIP-50 (relay/commands/search.py)
    bad = 0
    for check in checks:
        label = check.table if check.table == check.projector else f"{check.projector}.{check.table}"
        note = f" ({'at least ' if _log_full(refused, config) else ''}{refused[check.projector]} events refused)" \
            if refused.get(check.projector) and check.table == check.projector else ""
        if check.ok:
            print(f"{label}: ok, {check.rows} rows{note}")
            continue
        bad += 1
        if check.problem:
            print(f"{label}: {check.problem}")
            continue
        print(f"{label}: {len(check.missing)} missing, {len(check.orphan)} orphan, "
              f"{len(check.mismatched)} mismatched of {check.rows} rows{note}")
        for what, keys in (("missing", check.missing), ("orphan", check.orphan), ("mismatched", check.mismatched)):
            for key in keys[:SHOWN_PER_KIND]:
                print(f"  {what}: {' | '.join(map(str, key))}")
            if len(keys) > SHOWN_PER_KIND:
                print(f"  ... and {len(keys) - SHOWN_PER_KIND} more {what}")
    for name in removed:
        print(f"{name}: no longer configured (table kept, not maintained, not checked)")
    for name, progress in building.items():
        print(f"{name}: building ({progress['done']} of {progress['total']} events), not checked")
    print(f"relay verify: {len(checks) - bad} of {len(checks)} projected tables agree with the events"
          + ("" if not bad else f"; {bad} do not"))
    indexes_ok = _print_index_checks(index_checks)
    search_ok = print_search_check(search_check, config)
    if bad or not indexes_ok or not search_ok:
        return 1
    return BUILDING_EXIT if building else 0


def _print_index_checks(checks: list[IndexCheck]) -> bool:
    """One line per indexed filter (NIP-77), then a summary; True when every index agrees with the events."""
    for check in checks:
        label = f"negentropy index {check.spec}"
        if check.problem:
            print(f"{label}: {check.problem}")
        elif check.ok:
            print(f"{label}: ok, {check.items} items")
        else:
            print(f"{label}: {check.missing} events missing, {check.extra} items without an event, "
                  f"{len(check.nodes)} node problems")
            for problem in check.nodes[:SHOWN_PER_KIND]:
                print(f"  {problem}")
    good = sum(check.ok for check in checks)
    print(f"relay verify: {good} of {len(checks)} negentropy indexes agree with the events")
    return good == len(checks)


def _log_full(counts: dict[str, int], config: Config) -> bool:
    """Whether the refusal log (projector -> refusals kept) is full: it keeps the newest
    `store.max_projector_refusals` of all projectors, so a count is then at least what it holds."""
    return sum(counts.values()) >= config.store.max_projector_refusals


def run_projectors_list(config: Config) -> int:
    """`relay projectors list`: each configured or remembered projector, its kind, revision, state, rows, refusals."""
    conn = open_readonly(config.store.path, "projectors")
    if conn is None:
        return 2
    with closing(conn):
        states = projector_states(conn, config)
    lines = [("NAME", "KIND", "REV", "STATE", "ROWS", "REFUSALS", "TABLES")]
    counts = {p["name"]: p["refusals"] for p in states}
    more = "+" if _log_full(counts, config) else ""  # "3+": at least 3
    lines += [(p["name"], p["kind"], p["revision"], p["state"], p["rows"],
               f"{p['refusals']}{more if p['refusals'] else ''}", ",".join(p["tables"])) for p in states]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(str(v).ljust(w) for v, w in zip(line, widths)).rstrip())
    return 0


def run_projectors_rebuild(config: Config, name: str) -> int:
    """`relay projectors rebuild NAME`: recompute one configured projector's tables now; 2 if unknown.

    Raises:
        DatabaseUnusable: no relay database at `store.path` (missing, not SQLite, or without a relay schema;
            the command line's exit 2).
    """
    names = [s.name for s in config.projectors]
    if name not in names:
        print(f"relay projectors rebuild: no configured projector {name!r} (configured: {', '.join(names) or 'none'})",
              file=sys.stderr)
        return 2
    require_database(config.store.path, SERVED_DATABASE_HINT)  # a typo must not start a new database
    conn = sqlite3.connect(config.store.path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        db.relay_schema_version(conn, config.store.path)  # not another program's file: it would migrate it
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {config.store.synchronous.upper()}")
        db.migrate(conn)
        ensure_store_tables(conn)
        started = time.perf_counter()
        events = force_rebuild(conn, config.projectors, name, config.store.projector_rebuild_batch,
                               config.store.max_projector_refusals)
    finally:
        conn.close()
    print(f"rebuilt {name} from {events} events in {time.perf_counter() - started:.2f} s")
    return 0


def run_projectors_refusals(config: Config, projector: str | None, limit: int, as_json: bool) -> int:
    """`relay projectors refusals`: the newest refusals first (time, projector, event id, reason); "none" when
    there are none (nothing with --json)."""
    conn = open_readonly(config.store.path, "projectors")
    if conn is None:
        return 2
    with closing(conn):
        rows = recent_refusals(conn, projector, limit)
    if not rows and not as_json:  # an empty answer would look like a failed command
        print("none" if projector is None else f"none for {projector}")
    for at, name, event_id, reason in rows:
        when = utc_time(at)
        if as_json:
            sys.stdout.buffer.write(orjson.dumps({"at": at, "projector": name, "event_id": event_id,
                                                  "reason": reason}) + b"\n")
        else:
            print(f"{when}\t{name}\t{event_id}\t{reason}")
    return 0


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_field(value: object) -> str:
    """One value as a TSV field (PostgreSQL's COPY text format): NULL is `\\N`; backslash, tab, newline
    and carriage return are escaped, so a row is always one line."""
    return "\\N" if value is None else str(value).translate(_TSV_ESCAPES)


def run_query(config: Config, table: str, where: str | None, output: str, limit: int | None,
              keyset: KeysetQuery | None = None) -> int:
    """`relay query TABLE [--where SQL | --pk JSON | --param COL=VALUE... --order-by COL --after CURSOR]
    [--json | --csv] [--limit N]`: rows of a projected table.

    `output` "tsv": tab-separated with a header line, one line per row
    (`tsv_field`); "csv": RFC 4180 with a header line (NULL is an empty
    field); "json": one JSON object per line.  `--where` is an SQL
    expression run on a read-only connection; `keyset` reads a declared
    projector's rows by key or indexed columns with bound parameters
    (relay/store/records.py), and when more rows follow, prints the `--after`
    cursor of the next page on stderr.
    Returns 2 for a table that is not projected, a bad expression or a bad parameter (named), BUILDING_EXIT (3)
    while its projector is being built.
    """
    conn = open_readonly(config.store.path, "query")
    if conn is None:
        return 2
    with closing(conn):
        known = {t for s in config.projectors for t in s.table_names}
        known |= {t for record in read_meta(conn).values() for t in record.get("tables", ())}
        if table not in known or not table_exists(conn, table):
            print(f"relay query: {table!r} is not a projected table (known: {', '.join(sorted(known)) or 'none'})",
                  file=sys.stderr)
            return 2
        owner = next((s.name for s in config.projectors if table in s.table_names), None)
        if owner is not None and (progress := build_progress(conn, owner)) is not None:
            print(f"relay query: {table} is being built ({progress['done']} of {progress['total']} events); "
                  "try again when it is done", file=sys.stderr)
            return BUILDING_EXIT
        if keyset is not None:
            return _keyset_query(conn, views(config.projectors).get(table), keyset, output, limit)
        sql = f"SELECT * FROM {quote(table)}"
        if where:  # on lines of its own, in parentheses: a trailing `--` comment cannot swallow the LIMIT
            sql += f" WHERE (\n{where}\n)"
        if limit is not None:
            sql += f" LIMIT {int(limit):d}"
        try:
            cursor = conn.execute(sql)
        except sqlite3.Error as exc:
            print(f"relay query: {exc}", file=sys.stderr)
            return 2
        _print_rows([d[0] for d in cursor.description], cursor, output)
    return 0


@dataclass(frozen=True)
class KeysetQuery:
    """`relay query`'s bound-parameter options: `pk` (the whole key) or `params` (column -> value), `order_by`,
    `after` (a cursor printed by an earlier page)."""

    pk: dict[str, object] | None
    params: dict[str, object]
    order_by: str | None
    after: str | None


def _keyset_query(conn: sqlite3.Connection, view: TableView | None, query: KeysetQuery, output: str,
                  limit: int | None) -> int:
    if view is None:
        print("relay query: --pk, --param, --order-by and --after read declared projectors' tables only "
              "(use --where for this one)", file=sys.stderr)
        return 2
    try:
        if query.pk is not None:
            row = view.get(conn, query.pk)
            page = Page([row] if row is not None else [], None)
        else:
            page = view.query(conn, query.params, query.order_by, limit, query.after)
    except RecordQueryError as exc:
        print(f"relay query: {exc}", file=sys.stderr)
        return 2
    _print_rows(list(view.columns), ([row[c] for c in view.columns] for row in page.rows), output)
    if page.next is not None:
        print(f"relay query: more rows follow: --after {page.next}", file=sys.stderr)
    return 0


def _print_rows(columns: list[str], rows: Iterable[Sequence[object]], output: str) -> None:
    if output == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return
    out = sys.stdout.buffer
    if output == "tsv":
        out.write("\t".join(map(tsv_field, columns)).encode() + b"\n")
    for row in rows:
        if output == "json":
            out.write(orjson.dumps(dict(zip(columns, row))) + b"\n")
        else:
            out.write("\t".join(map(tsv_field, row)).encode() + b"\n")
