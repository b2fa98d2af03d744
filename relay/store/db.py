"""SQLite connections: pragmas, numbered migrations, and running whole jobs on aiosqlite's thread.

Every aiosqlite call is one hop to the connection's own thread.  The writer
and the query path hand it one whole job (a batch, a REQ) with `run`, so a
job costs one hop however many rows it touches.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import structlog

from relay.store.location import DatabaseUnusable, os_reason, require_database

log = structlog.get_logger(__name__)

T = TypeVar("T")

SYNCHRONOUS_MODES = ("off", "normal", "full", "extra")
# With a checkpointer task, the writer checkpoints itself only if the WAL passes this many pages (~256 MiB).
FALLBACK_AUTOCHECKPOINT_PAGES = 65536


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
    """BEGIN IMMEDIATE ... COMMIT on an autocommit connection; ROLLBACK and re-raise on any exception.

    While another connection holds the write lock (another process writing), BEGIN waits for it, logging
    `database_busy` each busy timeout (5 s): a writer waits out a long lock rather than failing (a relay whose
    writer fails stops).  Nothing has been written when BEGIN is refused, so trying again is safe.
    """
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            break
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                raise
            log.warning("database_busy", note="another connection holds the write lock: waiting for it")
    try:
        yield conn.cursor()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def rollback_open_transaction(conn: sqlite3.Connection) -> None:
    """ROLLBACK if a transaction is still open on `conn` (a failed job that began one outside `transaction`)."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def append_bounded(cur: sqlite3.Cursor, table: str, columns: tuple[str, ...], rows: list[tuple],
                   max_rows: int) -> None:
    """Append `rows` (values of `columns`) to the log `table`, whose `seq INTEGER PRIMARY KEY` orders it, and
    drop all but its newest `max_rows` rows.  A row equal to an older one on a UNIQUE column replaces it, as the
    newest.  `table` and `columns` are this package's names (not quoted)."""
    if not rows:
        return
    cur.executemany(f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                    rows)
    cur.execute(f"DELETE FROM {table} WHERE seq <= (SELECT max(seq) FROM {table}) - ?", (max_rows,))


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN ... ROLLBACK on an autocommit connection: one snapshot for every statement inside (it only reads)."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")


def relay_schema_version(conn: sqlite3.Connection, path: Path | str) -> int:
    """`PRAGMA user_version` of the database at `path` on `conn`: the migrations it has (at least 1).

    Raises:
        DatabaseUnusable: `path` is not an SQLite file, or holds no relay schema (version 0: an empty file an
            interrupted first import left, another program's database).
    """
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise DatabaseUnusable(path, str(exc)) from None
    if version == 0:
        raise DatabaseUnusable(path, "not a relay database (no schema: empty, or another program's)")
    return version


def require_relay_database(path: Path | str, hint: str) -> None:
    """Refuse what is not a relay's database at `path` before a command opens it to write (`require_database`,
    then `relay_schema_version`): opening would write the relay's schema into an empty file or another
    program's database.

    Raises:
        DatabaseUnusable: nothing at `path` (the message ends with `hint`), not an SQLite file, or no relay schema.
    """
    require_database(path, hint)
    try:
        conn = connect_readonly(Path(path))
    except sqlite3.Error as exc:
        raise DatabaseUnusable(path, str(exc)) from None
    try:
        relay_schema_version(conn, path)
    finally:
        conn.close()


def in_wal_mode(path: Path | str) -> bool:
    """Whether the SQLite file at `path` is in WAL mode, read from its header (opening it would create -wal and
    -shm files beside `path`, even through a hard link to a database another relay holds).

    Raises:
        DatabaseUnusable: the file cannot be read, or does not begin with SQLite's header (text, another format).
    """
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise DatabaseUnusable(path, os_reason(exc)) from None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        raise DatabaseUnusable(path, "file is not a database")
    return header[18] == 2  # the file format's read version: 2 is WAL


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only stdlib connection to the database at `path` (autocommit, 5 s busy timeout, query_only).

    In WAL mode even a reader needs the -shm file, and creates it when absent:
    where this user may not (a database of another user, in a directory it
    cannot write), a database with no WAL content (closed cleanly) is opened
    `immutable` instead: nothing is in a -wal file to be missed.

    Raises:
        sqlite3.Error: the file cannot be opened or read (not a database, unreadable).
    """
    uri = path.resolve().as_uri()
    try:
        return _checked(sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None))
    except sqlite3.OperationalError:
        if Path(f"{path}-wal").exists() and Path(f"{path}-wal").stat().st_size > 0:
            raise
    return _checked(sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None))


def _checked(conn: sqlite3.Connection) -> sqlite3.Connection:
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA query_only = 1")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the first read opens the WAL index
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def migrations() -> list[tuple[int, str]]:
    """The numbered migrations shipped in `relay/store/migrations/`, as (number, SQL), in order."""
    found = []
    for entry in resources.files("relay.store.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), entry.read_text(encoding="utf-8")))
    numbers = [number for number, _ in found]
    if len(set(numbers)) != len(numbers):  # two files with one number: only one would ever run
        raise RuntimeError(f"migrations: a number is used twice in {sorted(numbers)}")
    return sorted(found)


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration newer than `PRAGMA user_version`, each in its own transaction.

    Returns the schema version reached.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for number, sql in migrations():
        if number <= version:
            continue
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{sql}\nPRAGMA user_version = {number:d};\nCOMMIT;")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        version = number
    return version


def _configure(conn: sqlite3.Connection, synchronous: str, readonly: bool, autocheckpoint_pages: int,
               cache_kib: int | None, mmap_bytes: int) -> None:
    conn.execute("PRAGMA busy_timeout = 5000")
    if not readonly:
        _refuse_foreign(conn)
    conn.execute("PRAGMA temp_store = MEMORY")
    # KiB of page cache: the writer's 64 MiB (by default) holds the hot index pages; readers
    # share the OS page cache, so 16 MiB each is enough.
    conn.execute(f"PRAGMA cache_size = {-(cache_kib or (16384 if readonly else 65536)):d}")
    if readonly:
        conn.execute("PRAGMA query_only = 1")
        # Pages read through the map fault in with the kernel's read-around (as LMDB's do): a random read of a
        # cold store brings its neighbours, so the store becomes resident as it is read, and a page cache
        # emptied by another connection's commit costs no copy (1M store, under 1,650 events/s: `ids` of 100
        # 9.7 -> 1.7 ms p50).  pread reads only the page asked for.
        conn.execute(f"PRAGMA mmap_size = {mmap_bytes:d}")
    else:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint_pages:d}")


def _refuse_foreign(conn: sqlite3.Connection) -> None:
    """Refuse to write to another program's database: tables but no relay schema (`user_version` 0; every
    migration sets it in its own transaction).  Checked before `journal_mode = WAL`, which would change its file.

    Raises:
        sqlite3.DatabaseError: naming what the file holds.
    """
    if conn.execute("PRAGMA user_version").fetchone()[0] == 0 and \
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None:
        raise sqlite3.DatabaseError("not a relay database: it holds another program's tables (no relay schema)")


async def connect(path: Path, synchronous: str = "normal", readonly: bool = False,
                  autocheckpoint_pages: int = 1000, cache_kib: int | None = None,
                  mmap_bytes: int = 0) -> aiosqlite.Connection:
    """Open one aiosqlite connection in autocommit mode with our pragmas (WAL).

    `autocheckpoint_pages` is SQLite's `wal_autocheckpoint` for a writing connection; `cache_kib` its page
    cache in KiB (None: 64 MiB for a writer, 16 MiB for a reader); `mmap_bytes` a reader's `mmap_size`
    (SQLite caps it at its build's SQLITE_MAX_MMAP_SIZE).

    Read connections return TEXT as bytes, so stored event JSON goes to the
    socket without a decode/encode round trip.
    """
    if synchronous not in SYNCHRONOUS_MODES:
        raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}")
    conn = aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
    # A daemon thread: a store left open on an error path must not keep the process
    # from exiting (WAL rolls back whatever was not committed).
    conn._thread.daemon = True
    await conn
    await run(conn, _configure, synchronous, readonly, autocheckpoint_pages, cache_kib, mmap_bytes)
    if readonly:
        conn.text_factory = bytes
    return conn


async def run(conn: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(sqlite3_connection, *args)` on the connection's thread and await its result.

    aiosqlite exposes no public call for this; `_execute` is the primitive
    its own methods use.
    """
    return await conn._execute(lambda: fn(conn._conn, *args))
