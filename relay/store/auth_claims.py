"""NIP-98 auth events used up by NIP-86 calls: each may authorize one call (no replay within its window).

An auth event is known by its signature: its id covers created_at, tags and
content only, so the same call signed twice in one second shares an id, while a
replay copies the signature too.

A claim is one writer job (`claim`), so the one writer decides for every
process of the relay (a worker's job runs there: relay/channel/), and the
claims survive a restart; rows whose window has ended are dropped at each claim.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.store.db import transaction
from relay.store.writes import Changes, TransactionHook


def claim(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], sig: str, until: int,
          now: int) -> tuple[Changes, bool]:
    """`Store.run_job` job: use up the auth event signed `sig` (128 hex) until unix time `until`; True when it
    was not used already (its window still open at `now`)."""
    with transaction(conn) as cur:
        cur.execute("DELETE FROM nip98_used WHERE until < ?", (now,))
        cur.execute("INSERT OR IGNORE INTO nip98_used (sig, until) VALUES (?, ?)", (bytes.fromhex(sig), until))
        return Changes(), cur.rowcount == 1
