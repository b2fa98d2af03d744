"""A database made by an earlier version upgrades in place: every migration since runs, nothing stored is lost,
and `relay verify` finds the projected tables and indexes in agreement with the events.

`fixtures/relay-v16.db.gz`: schema version 16 (the code before migration 0017), made by `relay import --create`
of 324 real events of ../shared/data (every kind there, at most 12 of each and 3 follow lists), with one NIP-98
claim in `nip98_used` (by id, as version 16 kept them); gzipped (900 kB -> 270 kB).
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from relay.store.db import migrations
from tests.served import relay_cli

FIXTURE = Path(__file__).parent / "fixtures" / "relay-v16.db.gz"


def _events(path: Path) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT id, kind, created_at FROM events ORDER BY id").fetchall()


def test_a_version_16_database_upgrades_and_verifies(tmp_path):
    """Opened for writing (an empty `relay import`), the v16 fixture reaches the newest schema; its events are
    all there; `nip98_used` is keyed by signature (0017: the claims by id are dropped, at most one window's);
    `relay verify` exits 0."""
    db = tmp_path / "relay.db"
    with gzip.open(FIXTURE) as src, open(db, "wb") as out:
        shutil.copyfileobj(src, out)
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 16
        assert conn.execute("SELECT count(*) FROM nip98_used").fetchone()[0] == 1
    before = _events(db)
    assert len(before) == 303

    upgraded = relay_cli("import", "-", "--db", db, stdin=b"")
    assert upgraded.returncode == 0, upgraded.stderr
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == migrations()[-1][0] >= 17
        assert [row[1] for row in conn.execute("PRAGMA table_info(nip98_used)")] == ["sig", "until"]
        assert conn.execute("SELECT count(*) FROM nip98_used").fetchone()[0] == 0
    assert _events(db) == before

    verified = relay_cli("verify", "--db", db)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "ok" in verified.stdout and "mismatch" not in verified.stdout
