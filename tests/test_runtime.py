"""The runtime directory: one per database whatever path names it, private to the user."""

import os

import pytest

from relay.runtime import runtime_dir


def test_one_directory_per_database_whatever_its_path(tmp_path):
    db = tmp_path / "relay.db"
    db.touch()
    link = tmp_path / "link.db"
    link.symlink_to(db)
    assert runtime_dir(db) == runtime_dir(link) == runtime_dir(tmp_path / "." / "relay.db")
    assert runtime_dir(db) != runtime_dir(tmp_path / "other.db")
    assert len(str(runtime_dir(db) / "writer.sock")) < 107  # AF_UNIX path limit
    assert runtime_dir(db).stat().st_mode & 0o777 == 0o700


def test_a_directory_others_can_enter_is_refused(tmp_path):
    path = runtime_dir(tmp_path / "relay.db")
    os.chmod(path, 0o755)
    with pytest.raises(OSError, match="not private"):
        runtime_dir(tmp_path / "relay.db")
    os.chmod(path, 0o700)
