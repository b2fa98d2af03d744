"""One relay per database and per port: exclusive locks that `relay serve` holds for its whole life.

How this works: before it opens the store, `relay serve` takes an exclusive
`flock` on a file beside the database (`<db>.lock`), and before it binds a
fixed port, one on `relay-port-<port>.lock` in the temporary directory; it
then writes into each file who holds it (pid, host, database, port, as JSON).
A second `relay serve` finds the lock taken and names the holder from the
file (`LockHeld`).  The kernel drops a flock when its process dies, however
it dies (SIGKILL included), so a lock never outlives its relay and needs no
clean-up; a file left behind means nothing while nobody holds its lock.

Scope: containers sharing a database volume share its lock (one kernel; the
holder's pid is then that of its own container, so the host is named too).
A port lock is seen by the relays that share the temporary directory, as
those of one machine or one container do.  On a network file system flock
may not be enforced between machines: serve such a database from one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
from pathlib import Path


class LockHeld(RuntimeError):
    """Another relay holds the lock; `holder` is what it wrote in the file ({} when it could not be read).

    The message is one line: what is held, by which pid (and host, if not this one), and `advice`.
    """

    def __init__(self, what: str, holder: dict, advice: str) -> None:
        pid, host = holder.get("pid", "unknown"), holder.get("host")
        where = f"pid {pid}" + (f" on host {host}" if host and host != socket.gethostname() else "")
        super().__init__(f"{what} is held by another relay ({where}); {advice}")
        self.holder = holder


class InstanceLock:
    """An exclusive flock on `path` (created if absent), naming its holder in the file; see the module comment.

    `what` names the locked thing in errors ("database data/relay.db"), `advice` says what to do then.
    """

    def __init__(self, path: Path, what: str, advice: str) -> None:
        self.path = path
        self.what = what
        self.advice = advice
        self._fd: int | None = None

    def acquire(self, about: dict) -> None:
        """Take the lock or raise `LockHeld` at once (never waits); then write our pid and host and `about`.

        Raises:
            LockHeld: another process holds it.
            OSError: the file cannot be created or opened.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)  # a new database's directory, made before the store
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            writable = True
        except PermissionError:  # another user's file: a read-only descriptor can still hold the lock
            fd, writable = os.open(self.path, os.O_RDONLY), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockHeld(self.what, holder, self.advice) from None
        self._fd = fd
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), **about}).encode(), 0)

    def release(self) -> None:
        """Let the lock go (closing the file); the file stays, meaning nothing until locked again."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):  # being written, or not ours
        return {}
    return holder if isinstance(holder, dict) else {}


def database_lock(db_path: str | Path) -> InstanceLock:
    """The lock of the SQLite database at `db_path`: `<db_path>.lock` beside it."""
    path = Path(db_path)
    return InstanceLock(path.with_name(path.name + ".lock"), f"database {db_path}",
                        "stop it first, or serve another database (--db)")


PORT_ADVICE = "choose another port with --port or RELAY_SERVER__PORT (0: any free port)"


def port_lock(port: int) -> InstanceLock:
    """The lock of TCP port `port` (whatever the address): `relay-port-<port>.lock` in the temporary directory."""
    return InstanceLock(Path(tempfile.gettempdir()) / f"relay-port-{port:d}.lock", f"port {port:d}", PORT_ADVICE)
