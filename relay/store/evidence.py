"""The evidence of a deleted newest version: what makes syncing nodes agree on a deleted coordinate.

A replaceable or addressable coordinate's high-water mark survives the
deletion of its newest version (docs/architecture.md, invariant 5), so an older version
is refused for ever.  A peer that never saw the newest version still holds
an older one, and would serve it for ever: the deleted version itself is not
stored, so it never travels with the events.  The mark therefore keeps the
deleted version's JSON (`coordinates.deleted_raw`), and peer sync, when the
peer offers an older version, sends the peer the deletion and then that
version: the peer refuses it as deleted and, by the same rule, raises its
mark and drops the older version.  Nothing of it is served by `REQ`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from relay.store.batch import Coordinate, Row


def keep(cur: sqlite3.Cursor, deleted: list[Row]) -> None:
    """Keep the JSON of versions deleted by an `e` tag on their coordinate's mark, when they are the mark."""
    cur.executemany(
        "UPDATE coordinates SET deleted_raw = ? WHERE kind = ? AND pubkey = ? AND d_tag = ? AND id = ?",
        [(r.raw, r.kind, r.pubkey, r.d_tag, r.id) for r in deleted])


def _bytes(text: str | bytes) -> bytes:
    # Read connections return TEXT as bytes (the JSON is served as it is); a plain connection, as str.
    return text if isinstance(text, bytes) else text.encode()


def select(conn: sqlite3.Connection, coordinates: Iterable[Coordinate]) -> list[tuple[bytes, bytes]]:
    """(deletion JSON, deleted version JSON) for each of `coordinates` whose mark names a version deleted by `e`.

    Only pairs whose deletion is still stored: without it, a peer would take
    the version as live.
    """
    found = []
    for kind, pubkey, d_tag in dict.fromkeys(coordinates):
        row = conn.execute(
            "SELECT d.raw, c.deleted_raw FROM coordinates c"
            " JOIN tombstones t ON t.id = c.id AND t.pubkey = c.pubkey"
            " JOIN events d ON d.id = t.deletion_id"
            " WHERE c.kind = ? AND c.pubkey = ? AND c.d_tag = ? AND c.deleted_raw IS NOT NULL LIMIT 1",
            (kind, pubkey, d_tag)).fetchone()
        if row is not None:
            found.append((_bytes(row[0]), _bytes(row[1])))
    return found
