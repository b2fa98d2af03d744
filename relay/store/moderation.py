"""The operator's moderation lists in the `moderation` table: bans, allow lists, blocked IPs, NIP-86 overrides.

How this works: each row is (list, item, reason, at), one table for every
list (`LISTS`).  Every change raises `meta.moderation_version` in the same
transaction, so a relay reads the lists again (`load`) when `version` says
another process (`relay ban`) changed them.  The writer's jobs that change
them are in relay/store/bans.py.  The write transaction consults the bans
itself (`refused`): an event queued before its ban committed is refused
all the same.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from relay.protocol.event import Event, is_hex64

BANNED_PUBKEY, ALLOWED_PUBKEY, TRUSTED_PUBKEY = "banned_pubkey", "allowed_pubkey", "trusted_pubkey"
BANNED_EVENT, ALLOWED_EVENT = "banned_event", "allowed_event"
ALLOWED_KIND, DISALLOWED_KIND, BLOCKED_IP = "allowed_kind", "disallowed_kind", "blocked_ip"
INFO = "info"
"""NIP-86 overrides of `[info]`: item name, description or icon; the value is the row's reason."""
PURGE_PUBKEY = "purge_pubkey"
"""A banned pubkey whose stored events are still being removed (relay/store/bans.py)."""
REPORT_KIND = 1984  # NIP-56
MAX_REPORTS_READ = 10_000
"""Reports read at most by one `listeventsneedingmoderation` call, newest first."""
LISTS = (BANNED_PUBKEY, ALLOWED_PUBKEY, TRUSTED_PUBKEY, BANNED_EVENT, ALLOWED_EVENT, ALLOWED_KIND,
         DISALLOWED_KIND, BLOCKED_IP, INFO, PURGE_PUBKEY)


@dataclass(frozen=True, slots=True)
class Entry:
    """One row: `item` on `list`, with the operator's `reason` ("" when none) and when (`at`, unix seconds)."""

    list: str
    item: str
    reason: str = ""
    at: int = 0


def version(conn: sqlite3.Connection) -> int:
    """The number of moderation changes made so far (read job)."""
    return int(conn.execute("SELECT value FROM meta WHERE key = 'moderation_version'").fetchone()[0])


def load(conn: sqlite3.Connection) -> tuple[int, list[Entry]]:
    """(version, every entry) in one snapshot (`Store.read_snapshot` job)."""
    # (read connections hand TEXT over as bytes)
    return version(conn), [Entry(name.decode(), item.decode(), reason.decode(), at) for name, item, reason, at in
                           conn.execute("SELECT CAST(list AS BLOB), CAST(item AS BLOB), CAST(reason AS BLOB), at"
                                        " FROM moderation ORDER BY list, at, item")]


def bump(cur: sqlite3.Cursor) -> None:
    """Count one change, in the caller's transaction (see the module's header)."""
    cur.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'moderation_version'")


def write_entry(cur: sqlite3.Cursor, entry: Entry, drop: Sequence[str] = ()) -> None:
    """Add or replace `entry` and remove its item from the lists `drop`, in the caller's transaction."""
    cur.execute("INSERT OR REPLACE INTO moderation (list, item, reason, at) VALUES (?, ?, ?, ?)",
                (entry.list, entry.item, entry.reason, entry.at))
    cur.executemany("DELETE FROM moderation WHERE list = ? AND item = ?", [(d, entry.item) for d in drop])
    bump(cur)


def refused(cur: sqlite3.Cursor, events: list[Event]) -> set[str]:
    """The hex ids of `events` that are banned, or whose author is (in the write transaction: one probe while
    nothing is banned, else one statement)."""
    if cur.execute("SELECT 1 FROM moderation WHERE list IN (?, ?) LIMIT 1", (BANNED_EVENT, BANNED_PUBKEY)
                   ).fetchone() is None:
        return set()
    rows = cur.execute(
        "SELECT item FROM moderation WHERE list = ? AND item IN (SELECT value FROM json_each(?))"
        " UNION ALL SELECT item FROM moderation WHERE list = ? AND item IN (SELECT value FROM json_each(?))",
        (BANNED_EVENT, json.dumps([e.id for e in events]), BANNED_PUBKEY,
         json.dumps(list({e.pubkey for e in events})))).fetchall()
    if not rows:
        return set()
    banned = {r[0] for r in rows}
    return {e.id for e in events if e.id in banned or e.pubkey in banned}


def reported_events(conn: sqlite3.Connection, limit: int, max_reports: int = MAX_REPORTS_READ
                    ) -> list[tuple[str, str]]:
    """NIP-56 reports (kind 1984) naming a stored event with an `e` tag that is neither banned nor allowed:
    (event id hex, the report type of that tag, e.g. "spam", else "reported"), newest report first, at most
    `limit`, from the newest `max_reports` reports (read job).  A report naming only a pubkey (`p` tag)
    names no event: not listed."""
    handled = {r[0].decode() for r in conn.execute("SELECT CAST(item AS BLOB) FROM moderation WHERE list IN (?, ?)",
                                                   (BANNED_EVENT, ALLOWED_EVENT))}
    found: dict[str, str] = {}
    for (raw,) in conn.execute("SELECT raw FROM events WHERE kind = ? ORDER BY created_at DESC LIMIT ?",
                               (REPORT_KIND, max_reports)):
        for tag in json.loads(raw)["tags"]:
            if len(found) >= limit:
                return list(found.items())
            if len(tag) < 2 or tag[0] != "e" or not is_hex64(tag[1]) or tag[1] in found or tag[1] in handled:
                continue
            if conn.execute("SELECT 1 FROM events WHERE id = ?", (bytes.fromhex(tag[1]),)).fetchone():
                found[tag[1]] = tag[2] if len(tag) > 2 and isinstance(tag[2], str) and tag[2] else "reported"
    return list(found.items())
