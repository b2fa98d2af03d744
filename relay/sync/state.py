"""Per-peer sync state in the database (table `sync_peers`, migration 0004): counts, errors, leases, push cursor.

How the lease works: a process may sync a peer only while it holds that
peer's lease, a row field `lease_owner` with an expiry `lease_expires`.
Taking it is one UPDATE that succeeds only when the lease is free, expired,
or already ours; SQLite serializes writers, so across processes on one
database at most one owner wins.  The holder renews it well before expiry
and stops syncing that peer as soon as a renewal fails (another process
took it after our lease ran out, e.g. while we were stalled).

The functions take a plain `sqlite3.Connection` in autocommit mode, so
tests call them directly; `PeerStates` runs them on an aiosqlite connection.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from relay.store import db

log = structlog.get_logger(__name__)

_COLUMNS = ("url", "last_attempt", "last_success", "events_in", "events_out", "last_error", "last_error_at",
            "lease_owner", "lease_expires", "lasting_differences", "refused", "push_cursor")


@dataclass(frozen=True)
class PeerState:
    """One row of `sync_peers`: times in unix seconds (None: never), counts of events and ids."""

    url: str
    last_attempt: int | None
    last_success: int | None
    events_in: int
    events_out: int
    last_error: str | None
    last_error_at: int | None
    lease_owner: str | None
    lease_expires: float | None
    lasting_differences: int = 0  # ids found different in the last two reconciliations (differences.py)
    refused: int = 0  # events the peer refused for good in the last complete reconciliation (session.py)
    push_cursor: int | None = None  # change feed position the live push has delivered up to; None: never

    def as_dict(self) -> dict:
        """The row as a JSON-ready dict."""
        return asdict(self)


_OWNERS: set[str] = set()  # the owner names made by this process


def new_owner() -> str:
    """A lease owner name unique to this process: "host:pid:random"."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    _OWNERS.add(owner)
    return owner


def _ensure(conn: sqlite3.Connection, url: str) -> None:
    conn.execute("INSERT OR IGNORE INTO sync_peers (url) VALUES (?)", (url,))


def holder_is_gone(holder: str, owner: str) -> bool:
    """True when lease holder `holder` ("host:pid:random") is a process of this host that no longer runs.

    `owner` is ours: a holder with our host and pid that this process did not
    make is a predecessor whose pid we now have (a restarted container's pid 1).
    """
    host, _, rest = holder.partition(":")
    pid, _, _ = rest.partition(":")
    if host != owner.partition(":")[0] or not pid.isdigit() or holder in _OWNERS:
        return False
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        return False
    return _is_zombie(int(pid))


def _is_zombie(pid: int) -> bool:
    # A killed process not yet reaped by its parent still answers kill(0) (for seconds, where pid 1 is slow).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile, or no /proc: not known to be a zombie
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def acquire_lease(conn: sqlite3.Connection, url: str, owner: str, now: float, seconds: float) -> bool:
    """Take (or extend) the lease on `url` for `seconds` from `now`; True when `owner` holds it.

    Succeeds when the lease is free, expired (`lease_expires <= now`), already
    `owner`'s, or held by a process of this host that no longer runs (one
    killed without releasing it: its successor need not wait for the expiry).
    """
    _ensure(conn, url)
    holder = _lease_holder(conn, url)
    gone = holder[0] if holder is not None and holder_is_gone(holder[0], owner) else owner
    cur = conn.execute(
        "UPDATE sync_peers SET lease_owner = ?, lease_expires = ?"
        " WHERE url = ? AND (lease_owner IS NULL OR lease_owner IN (?, ?) OR lease_expires <= ?)",
        (owner, now + seconds, url, owner, gone, now))
    return cur.rowcount == 1


def renew_lease(conn: sqlite3.Connection, url: str, owner: str, now: float, seconds: float) -> bool:
    """Extend `owner`'s lease on `url` to `now + seconds`; False when `owner` no longer holds it."""
    cur = conn.execute("UPDATE sync_peers SET lease_expires = ? WHERE url = ? AND lease_owner = ?",
                       (now + seconds, url, owner))
    return cur.rowcount == 1


def release_lease(conn: sqlite3.Connection, url: str, owner: str) -> None:
    """Give up `owner`'s lease on `url` (nothing happens if someone else holds it)."""
    conn.execute("UPDATE sync_peers SET lease_owner = NULL, lease_expires = NULL WHERE url = ? AND lease_owner = ?",
                 (url, owner))


def record_attempt(conn: sqlite3.Connection, url: str, now: int) -> None:
    """Note that a connection attempt to `url` starts at `now` (unix seconds)."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET last_attempt = ? WHERE url = ?", (now, url))


def add_counts(conn: sqlite3.Connection, url: str, events_in: int, events_out: int,
               success_at: int | None = None) -> None:
    """Add to the all-time event counts of `url`; with `success_at`, also set `last_success`."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET events_in = events_in + ?, events_out = events_out + ?,"
                 " last_success = coalesce(?, last_success) WHERE url = ?", (events_in, events_out, success_at, url))


def record_error(conn: sqlite3.Connection, url: str, now: int, error: str) -> None:
    """Remember why the last attempt on `url` failed (text truncated to 1000 characters)."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET last_error = ?, last_error_at = ? WHERE url = ?", (error[:1000], now, url))


def record_run(conn: sqlite3.Connection, url: str, now: int, refused: int, error: str | None) -> None:
    """Record a finished reconciliation with `url`: the events the peer `refused` for good, and `error`
    when some events could not be synced for now (else it was a success at `now`)."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET refused = ? WHERE url = ?", (refused, url))
    if error is None:
        conn.execute("UPDATE sync_peers SET last_success = ? WHERE url = ?", (now, url))
    else:
        record_error(conn, url, now, error)


def set_lasting_differences(conn: sqlite3.Connection, url: str, count: int) -> None:
    """Record how many ids the last two reconciliations with `url` both found different."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET lasting_differences = ? WHERE url = ?", (count, url))


def push_cursor(conn: sqlite3.Connection, url: str) -> int | None:
    """The change feed position up to which every event was pushed to `url` and answered; None: never."""
    row = conn.execute("SELECT push_cursor FROM sync_peers WHERE url = ?", (url,)).fetchone()
    return row[0] if row else None


def set_push_cursor(conn: sqlite3.Connection, url: str, cursor: int) -> None:
    """Record that every event up to change feed position `cursor` was pushed to `url` and answered."""
    _ensure(conn, url)
    conn.execute("UPDATE sync_peers SET push_cursor = ? WHERE url = ?", (cursor, url))


def read_states(conn: sqlite3.Connection) -> list[PeerState]:
    """Every peer's state, by URL; [] when the database predates the sync migration."""
    try:
        rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM sync_peers ORDER BY url").fetchall()
    except sqlite3.OperationalError:
        return []
    return [PeerState(*(r.decode() if isinstance(r, bytes) else r for r in row)) for row in rows]


class PeerStates:
    """The state functions above on one aiosqlite connection of their own (writes are rare and tiny)."""

    def __init__(self, conn) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, path: Path | str) -> PeerStates:
        """Connect to the (already migrated) database at `path`."""
        return cls(await db.connect(Path(path)))

    async def close(self) -> None:
        """Close the connection."""
        await self._conn.close()

    async def acquire_lease(self, url: str, owner: str, seconds: float) -> bool:
        """`acquire_lease` at the current time."""
        return await db.run(self._conn, acquire_lease, url, owner, time.time(), seconds)

    async def renew_lease(self, url: str, owner: str, seconds: float) -> bool:
        """`renew_lease` at the current time."""
        return await db.run(self._conn, renew_lease, url, owner, time.time(), seconds)

    async def release_lease(self, url: str, owner: str) -> None:
        """`release_lease`."""
        await db.run(self._conn, release_lease, url, owner)

    async def record_attempt(self, url: str) -> None:
        """`record_attempt` now."""
        await db.run(self._conn, record_attempt, url, int(time.time()))

    async def add_counts(self, url: str, events_in: int, events_out: int) -> None:
        """`add_counts` (a run's success is `record_run`'s)."""
        await db.run(self._conn, add_counts, url, events_in, events_out)

    async def record_error(self, url: str, error: str) -> None:
        """`record_error` now."""
        await db.run(self._conn, record_error, url, int(time.time()), error)

    async def record_run(self, url: str, refused: int, error: str | None) -> None:
        """`record_run` now."""
        await db.run(self._conn, record_run, url, int(time.time()), refused, error)

    async def set_lasting_differences(self, url: str, count: int) -> None:
        """`set_lasting_differences`."""
        await db.run(self._conn, set_lasting_differences, url, count)

    async def push_cursor(self, url: str) -> int | None:
        """`push_cursor`."""
        return await db.run(self._conn, push_cursor, url)

    async def set_push_cursor(self, url: str, cursor: int) -> None:
        """`set_push_cursor`."""
        await db.run(self._conn, set_push_cursor, url, cursor)

    async def read(self) -> list[PeerState]:
        """`read_states`."""
        return await db.run(self._conn, read_states)

    @asynccontextmanager
    async def hold(self, url: str, owner: str, seconds: float) -> AsyncIterator[None]:
        """Run the body while `owner` holds the lease on `url`, renewing it every `seconds / 3`.

        Raises:
            LeaseBusy: another process holds the lease (the body does not run).
            LeaseLost: a renewal found the lease taken by another process; the body was cancelled.
        """
        if not await self.acquire_lease(url, owner, seconds):
            raise LeaseBusy(url, await db.run(self._conn, _lease_holder, url))
        body = asyncio.current_task()
        lost = False

        async def renew() -> None:
            nonlocal lost
            while True:
                await asyncio.sleep(seconds / 3)
                try:
                    held = await self.renew_lease(url, owner, seconds)
                except sqlite3.Error as exc:  # e.g. locked for long: try again; the lease outlives two misses
                    log.warning("lease_renewal_failed", peer=url, error=repr(exc))
                    continue
                if not held:
                    lost = True
                    body.cancel()
                    return

        renewer = asyncio.create_task(renew(), name=f"lease {url}")
        try:
            yield
        except asyncio.CancelledError:
            if lost and body.uncancel() == 0:
                raise LeaseLost(url) from None
            raise
        finally:
            renewer.cancel()
            if not lost:
                try:
                    await self.release_lease(url, owner)
                except sqlite3.Error as exc:  # it expires by itself
                    log.warning("lease_release_failed", peer=url, error=repr(exc))


class LeaseBusy(RuntimeError):
    """Another process holds the lease on a peer; `holder` is (owner, expires unix seconds) or None."""

    def __init__(self, url: str, holder: tuple[str, float] | None) -> None:
        who = f"{holder[0]} until {time.strftime('%H:%M:%S', time.localtime(holder[1]))}" if holder else "someone"
        super().__init__(f"another process is syncing {url} (lease held by {who})")
        self.url = url
        self.holder = holder


class LeaseLost(RuntimeError):
    """Our lease on a peer was taken by another process while we were syncing it."""

    def __init__(self, url: str) -> None:
        super().__init__(f"lost the lease on {url} to another process")
        self.url = url


def _lease_holder(conn: sqlite3.Connection, url: str) -> tuple[str, float] | None:
    row = conn.execute("SELECT lease_owner, lease_expires FROM sync_peers WHERE url = ?", (url,)).fetchone()
    return (row[0], row[1]) if row and row[0] is not None else None
