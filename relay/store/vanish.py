"""NIP-62 requests to vanish in the write transaction: the stored events they cover, and the `vanished` table.

`batch.BatchPlan` decides in Python (with `protocol.vanish.covered`) which
events of a batch a request covers and refuses later ones; this module reads
the `vanished` rows a batch can touch and, at write time, finds the stored
rows a request covers and records the request.  Rows found here are removed
by `writes._delete_stored` and handed to the hooks like any removal, so
projected tables and the negentropy index follow.
"""

from __future__ import annotations

import sqlite3

from relay.protocol.event import Event, is_hex64
from relay.protocol.vanish import GIFT_WRAP_KIND, VANISH_KIND
from relay.store.batch import Row

VANISHED_SQL = "SELECT pubkey, until FROM vanished WHERE pubkey IN ({})"
"""`writes.ids_in` statement: (pubkey, until) of the listed pubkeys that asked to vanish."""

_COLUMNS = "e.seq, e.id, e.pubkey, e.created_at, e.kind, e.d_tag, e.raw"


def pubkeys_to_check(cur: sqlite3.Cursor, events: list[Event]) -> list[bytes]:
    """The 32-byte pubkeys whose `vanished` rows `events` can meet: their authors and the p-tags of gift
    wraps; none at all (one probe) while nobody has vanished."""
    if cur.execute("SELECT 1 FROM vanished LIMIT 1").fetchone() is None:
        return []
    keys = {e.pubkey for e in events}
    keys.update(p for e in events if e.kind == GIFT_WRAP_KIND for p in e.tag_values("p") if is_hex64(p))
    return [bytes.fromhex(k) for k in keys]


def select_covered(cur: sqlite3.Cursor, pubkey: bytes, until: int) -> list[Row]:
    """Stored rows a request to vanish of `pubkey` up to `until` (unix seconds) covers: the author's events
    (requests to vanish excepted) and the gift wraps p-tagging it, each once."""
    rows = {r[0]: Row(*r) for r in cur.execute(
        f"SELECT {_COLUMNS} FROM events e WHERE e.pubkey = ? AND e.created_at <= ? AND e.kind != ?",
        (pubkey, until, VANISH_KIND))}
    rows.update((r[0], Row(*r)) for r in cur.execute(
        f"SELECT {_COLUMNS} FROM tags t CROSS JOIN events e ON e.seq = t.seq"
        " WHERE t.name = 'p' AND t.value = ? AND t.created_at <= ? AND e.kind = ?",
        (pubkey.hex(), until, GIFT_WRAP_KIND)))
    return list(rows.values())


def record(cur: sqlite3.Cursor, requests: list[tuple[bytes, int, bytes]]) -> None:
    """Remember honoured requests (pubkey, until, request id); a pubkey keeps its newest `until`.

    The deleted versions kept as evidence (relay/store/evidence.py) that a request covers go too: nothing of the
    author's is kept but the marks' ids and times.
    """
    cur.executemany("UPDATE coordinates SET deleted_raw = NULL WHERE pubkey = ? AND created_at <= ?",
                    [(pubkey, until) for pubkey, until, _ in requests])
    cur.executemany(
        "INSERT INTO vanished (pubkey, until, request_id) VALUES (?, ?, ?)"
        " ON CONFLICT (pubkey) DO UPDATE SET until = excluded.until, request_id = excluded.request_id"
        " WHERE excluded.until > until", requests)
