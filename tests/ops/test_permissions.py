"""The relay run as the image's user (uid 10001) on database paths it cannot use: one line naming the path
and what is wrong, exit 2, before listening; the read-only commands read what they cannot write.

Tests run as root in CI, and root ignores file modes: the relay runs here under
`setpriv --reuid=10001 --regid=10001 --clear-groups`, in a directory made for it under /tmp (pytest's own
tmp_path is private to root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.served import CLI_TIMEOUT, clean_env

UID = 10001  # the Dockerfile's user
AS_USER = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]

pytestmark = pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                                reason="needs setpriv, run as root, to run the relay as another user")


@pytest.fixture
def place():
    """A directory every user may enter (not written by uid 10001), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="relay-perm-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def _own(path: Path, mode: int) -> Path:
    os.chown(path, UID, UID)
    path.chmod(mode)
    return path


def as_user(*args, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m relay ARGS` as uid 10001, JSON logs (stderr is not a terminal); bounded."""
    proc = subprocess.run([*AS_USER, sys.executable, "-m", "relay", *map(str, args)], capture_output=True,
                          text=True, env=clean_env(), cwd=cwd, timeout=CLI_TIMEOUT)
    return proc


def _imported(path: Path) -> Path:
    """A relay database at `path` holding one event, written by root (the relay's own import)."""
    subprocess.run([sys.executable, "-m", "relay", "import", "--create", "-", "--db", str(path)], input=b"",
                   check=True, env=clean_env(), capture_output=True, timeout=CLI_TIMEOUT)
    return path


def _wrong_places(place: Path) -> dict[str, tuple[Path, str]]:
    """Each mistake: the --db given, and what the one error line must say."""
    (place / "mine").mkdir()
    mine = _own(place / "mine", 0o755)
    theirs = place / "theirs"
    theirs.mkdir()
    other_owner = _imported(mine / "other.db")  # owned by root, in a directory uid 10001 writes
    read_only = _own(_imported(mine / "readonly.db"), 0o444)
    return {
        "directory": (mine, "is a directory"),
        "unwritable directory": (theirs / "relay.db", "directory is not writable by uid 10001"),
        "missing parent of an unwritable directory": (theirs / "sub" / "relay.db", f"no such directory {theirs}/sub"),
        "another user's database": (other_owner, "other.db is not readable and writable by uid 10001"),
        "mode 444": (read_only, "readonly.db is not readable and writable by uid 10001 (owner uid 10001, mode 0444)"),
    }


def test_serve_refuses_a_database_it_cannot_use_in_one_line_with_exit_2(place):
    """A directory as --db (one usage line), a directory it cannot write (the Docker bind-mount mistake), another
    user's database, a 444 file (which started, then refused every event and exited 1 looping
    `checkpoint_failed`): exit 2 before listening, one JSON error line naming the path, no traceback."""
    for mistake, (db, says) in _wrong_places(place).items():
        proc = as_user("serve", "--port", "0", "--db", db, cwd=place)
        assert proc.returncode == 2, (mistake, proc.stderr)
        if mistake == "directory":  # refused where the command line is read (relay/arguments.py), as a usage error
            assert proc.stderr.count("\n") == 1 and f"argument --db: '{db}' {says}" in proc.stderr, proc.stderr
            continue
        lines = [json.loads(line) for line in proc.stderr.splitlines()]  # every line JSON: no traceback
        errors = [line for line in lines if line["level"] == "error"]
        assert [e["event"] for e in errors] == ["database_unusable"], (mistake, proc.stderr)
        assert errors[0]["path"] == str(db) and says in errors[0]["error"], (mistake, errors)
        assert "relay_started" not in proc.stderr


def test_import_names_the_database_it_cannot_use(place):
    """`relay import` says the same in one line on stderr, exit 2."""
    (place / "theirs").mkdir()
    proc = as_user("import", "--create", "-", "--db", place / "theirs" / "relay.db", cwd=place)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"database {place / 'theirs' / 'relay.db'}: directory is not writable" in proc.stderr


def test_read_only_commands_read_a_database_they_cannot_write(place):
    """`relay status`, `verify`, `projectors list` and `query` read a database of another user in a directory
    they cannot write (they failed: a WAL reader must create the -shm file there)."""
    db = _imported(place / "relay.db")
    assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()
    status = as_user("status", "--json", "--db", db, cwd=place)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["database"]["schema_version"] > 0
    for command in (["verify"], ["projectors", "list"], ["query", "profiles"]):
        proc = as_user(*command, "--db", db, cwd=place)
        assert proc.returncode == 0, (command, proc.stderr)
