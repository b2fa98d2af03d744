"""One relay per database and per port (relay/locks.py): a second `relay serve` exits 2 naming the first's pid."""

from __future__ import annotations

import subprocess

import pytest

from relay.locks import InstanceLock, LockHeld
from tests.served import Served, free_port


def _second_serve(tmp_path, *args) -> tuple[int, list[str]]:
    """Run a second `relay serve ARGS` to its end (bounded): (exit code, its stderr lines that are not JSON logs)."""
    with Served(tmp_path, *args) as second:
        try:
            code = second.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a second relay serve {args} is still running:\n{second.stderr[-1500:]}")
        return code, [line for line in second.stderr.splitlines() if not line.startswith("{")]


def test_a_second_relay_on_the_same_database_exits_2_naming_the_first(tmp_path):
    """Two `relay serve` on one database (each on a free port): the second exits 2 with one line naming the
    first's pid, and the first keeps serving."""
    db = tmp_path / "one.db"
    port = free_port()
    with Served(tmp_path, "--db", db, "--port", port) as first:
        first.wait_health(port)
        code, lines = _second_serve(tmp_path, "--db", db, "--port", 0)
        assert code == 2
        assert lines == [f"relay: database {db} is held by another relay (pid {first.proc.pid}); "
                         "stop it first, or serve another database (--db)"]
        first.wait_health(port)


@pytest.mark.parametrize("link_kind, held, beside", [
    ("symbolic", "is held by another relay (pid {pid})", ["link.db"]),  # the lock file found through the link
    ("hard", "(through another name: a hard link) is held by another relay (pid unknown)",
     ["link.db", "link.db.lock"])])  # its own lock file, free: the database file's flock refused it
def test_a_link_to_a_served_database_is_the_same_database(tmp_path, link_kind, held, beside):
    """`relay serve --db LINK` where LINK (in another directory) is a symbolic or hard link to a served database:
    exit 2 with one line, no node key made beside the link; the first keeps serving."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    db, link = tmp_path / "x" / "r.db", tmp_path / "y" / "link.db"
    port = free_port()
    with Served(tmp_path, "--db", db, "--port", port) as first:
        first.wait_health(port)
        link.symlink_to(db) if link_kind == "symbolic" else link.hardlink_to(db)
        code, lines = _second_serve(tmp_path, "--db", link, "--port", 0)
        assert code == 2
        assert lines == [f"relay: database {link} {held.format(pid=first.proc.pid)}; "
                         "stop it first, or serve another database (--db)"]
        assert sorted(p.name for p in (tmp_path / "y").iterdir()) == beside
        first.wait_health(port)


def test_a_second_relay_on_the_same_port_exits_2_naming_the_first(tmp_path):
    """`relay serve --port P` while a relay holds P (with another database): exit 2, one line naming its pid and
    how to choose another port."""
    port = free_port()
    with Served(tmp_path, "--db", tmp_path / "a.db", "--port", port) as first:
        first.wait_health(port)
        code, lines = _second_serve(tmp_path, "--db", tmp_path / "b.db", "--port", port)
        assert code == 2
        assert lines == [f"relay: port {port} is held by another relay (pid {first.proc.pid}); "
                         "choose another port with --port or RELAY_SERVER__PORT (0: any free port)"]
        assert not (tmp_path / "b.db").exists()  # refused before opening anything


def test_a_killed_relay_leaves_no_lock_behind(tmp_path):
    """After SIGKILL (no clean-up runs), a new relay serves the same database on the same port at once."""
    db, port = tmp_path / "k.db", free_port()
    with Served(tmp_path, "--db", db, "--port", port) as first:
        first.wait_health(port)
        first.kill()
    with Served(tmp_path, "--db", db, "--port", port) as second:
        second.wait_health(port)
        assert second.stop() == 0


def test_a_held_lock_names_its_holder_even_unreadable(tmp_path):
    """The holder's file gives its pid; a file whose content is not ours still refuses, naming no pid."""
    path = tmp_path / "x.lock"
    first = InstanceLock(path, "thing x", "do y")
    first.acquire({"port": 1})
    try:
        with pytest.raises(LockHeld, match=r"^thing x is held by another relay \(pid \d+\); do y$") as held:
            InstanceLock(path, "thing x", "do y").acquire({})
        assert held.value.holder["port"] == 1
        path.write_text("not json")
        with pytest.raises(LockHeld, match=r"\(pid unknown\)"):
            InstanceLock(path, "thing x", "do y").acquire({})
    finally:
        first.release()
    again = InstanceLock(path, "thing x", "do y")
    again.acquire({})  # released: free again
    again.release()
