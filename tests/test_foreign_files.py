"""Files that are not the relay's, named where it expects its own: a device or a huge file as the configuration
or the node key is read with a bound; another program's SQLite database, an empty file or text as `--db` is
refused before anything is written to it (no relay schema, no WAL mode, no lock file beside it)."""

from __future__ import annotations

import sqlite3

import pytest

from tests.served import relay_cli

PUBKEY = "a" * 64


def _foreign_database(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    return path


@pytest.mark.parametrize("args", [("serve", "--config", "/dev/zero", "--port", "0"),
                                  ("status", "--config", "/dev/zero")])
def test_a_device_as_the_configuration_is_read_with_a_bound(args):
    """`--config /dev/zero`: one line, exit 2, at once (it was read until memory ran out)."""
    done = relay_cli(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().endswith("larger than 1048576 bytes: not a configuration file")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full"])
def test_a_device_as_the_node_key_is_read_with_a_bound(tmp_path, device):
    """`relay key --file /dev/zero`: one line saying what a key file holds, exit 1 (it was read without end)."""
    done = relay_cli("key", "--file", device, "--db", tmp_path / "x.db")
    assert done.returncode == 1 and done.stderr.strip() == f"relay: {device}: must hold one 64-hex secret key"


COMMANDS = [("export",), ("bans",), ("ban", "pubkey", PUBKEY), ("import", "/dev/null"),
            ("import", "/dev/null", "--create"), ("backup", "OUT"), ("serve", "--port", "0")]
# `--create` and `serve` start a new database in an empty file (what an interrupted first import leaves)
CASES = [(kind, command) for kind in ("another program's", "empty", "text") for command in COMMANDS
         if not (kind == "empty" and (command[0] == "serve" or "--create" in command))]


@pytest.mark.parametrize("kind, command", CASES)
def test_a_file_that_is_not_a_relay_database_is_left_as_it_was(tmp_path, kind, command):
    """Every command that writes to `--db` refuses a file without the relay's schema: exit 2, one line naming
    it, the file unchanged and nothing created beside it."""
    db = tmp_path / "other.db"
    if kind == "another program's":
        _foreign_database(db)
    else:
        db.write_bytes(b"" if kind == "empty" else b"not a database\n")
    before = db.read_bytes()
    args = [str(tmp_path / "out.db") if arg == "OUT" else arg for arg in command]
    done = relay_cli(*args, "--db", db)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "not a relay database" in done.stderr or "file is not a database" in done.stderr, done.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
