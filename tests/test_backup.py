"""`relay backup PATH` (a subprocess) while a relay serves and is written to."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

import orjson
import pytest

from relay.commands.backup import run_backup
from relay.store import db
from relay.store.location import DatabaseUnusable
from tests.conftest import make_config
from tests.helpers import Client, Keys
from tests.served import relay_cli_async


async def _publish_forever(client: Client, keys: Keys, acked: set[str]) -> None:
    """Publish new events one after another (each after the previous OK), adding each OK true to `acked`."""
    n = 0
    while True:
        n += 1
        event = keys.sign(content=f"written during the backup {n}")
        reply = await client.publish(event)
        assert reply[2] is True, reply
        acked.add(event["id"])


async def test_backup_while_serving_is_consistent_and_holds_what_was_acknowledged(relay, client, alice, tmp_path):
    """The copy passes integrity_check and holds every event acknowledged before the backup started."""
    for i in range(200):
        await client.send(["EVENT", alice.sign(content=f"before {i}")])
    acked = set()
    while len(acked) < 200:
        reply = await client.recv()
        assert reply[0] == "OK" and reply[2] is True, reply
        acked.add(reply[1])
    writer = asyncio.create_task(_publish_forever(client, alice, acked))
    try:
        while len(acked) < 220:  # the relay is being written to when the backup starts
            await asyncio.sleep(0.01)
        before = set(acked)
        target = tmp_path / "backups" / "copy.db"
        target.parent.mkdir()
        code, out, err = await relay_cli_async("backup", "--db", relay.config.store.path, target)
        after = set(acked)
    finally:
        writer.cancel()
    assert code == 0, err
    assert out.startswith(f"relay backup: wrote {target}: ")
    assert sorted(p.name for p in target.parent.iterdir()) == ["copy.db"]  # no partial file left behind
    with sqlite3.connect(target.as_uri() + "?mode=ro", uri=True) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        ids = {row[0].hex() for row in copy.execute("SELECT id FROM events")}
        raws = [orjson.loads(row[0]) for row in copy.execute("SELECT raw FROM events")]
    assert before <= ids
    assert ids <= after  # nothing but acknowledged events (some written during the backup may be in it)
    assert all(e["pubkey"] == alice.pubkey for e in raws)
    assert f"{len(ids)} events" in out


def _relay_database(path: str) -> None:
    """An empty relay database at `path`: the relay's schema, no events."""
    with closing(sqlite3.connect(path)) as conn:
        db.migrate(conn)


def test_backup_refuses_to_overwrite_an_existing_file(tmp_path, capsys):
    """An existing PATH: exit 1, a message naming it, and the file untouched; a missing database, or a file that
    is not a relay database: DatabaseUnusable (the command line's exit 2), nothing written."""
    config = make_config(tmp_path)  # run_backup, not cli.main: main would point the logs at capsys's files
    _relay_database(config.store.path)
    target = tmp_path / "taken.db"
    target.write_bytes(b"precious")
    assert run_backup(config, target) == 1
    assert f"relay backup: {target} exists; refusing to overwrite it" in capsys.readouterr().err
    assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relay.db", "taken.db"]
    with pytest.raises(DatabaseUnusable, match="no such database"):
        run_backup(make_config(tmp_path / "none"), tmp_path / "out.db")
    Path(config.store.path).write_bytes(b"")
    with pytest.raises(DatabaseUnusable, match="not a relay database"):  # before PATH is looked at
        run_backup(config, target)
    (tmp_path / "text.db").write_text("not SQLite at all, just some text that fills the header " * 4)
    with pytest.raises(DatabaseUnusable, match="not a database"):
        run_backup(make_config(tmp_path, store={"path": str(tmp_path / "text.db")}), tmp_path / "out.db")
    assert not (tmp_path / "out.db").exists()


def test_backup_into_a_missing_directory_names_that_directory(tmp_path, capsys):
    """A PATH whose directory does not exist: exit 2, and the message names PATH, not a temporary file."""
    config = make_config(tmp_path)
    _relay_database(config.store.path)
    target = tmp_path / "missing" / "copy.db"
    assert run_backup(config, target) == 2
    err = capsys.readouterr().err
    assert err == f"relay backup: {target}: no such file or directory\n"
    assert ".partial" not in err
