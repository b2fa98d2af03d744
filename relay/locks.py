"""One relay per database and per port: exclusive locks that `relay serve` holds for its whole life.

How this works: before it opens the store, `relay serve` takes an exclusive
`flock` on a file beside the database (`<db>.lock`, beside the file a
symbolic link leads to: every path of one database names one lock file), and
before it binds a fixed port, one on `relay-port-<port>.lock` in the
temporary directory; it then writes into each file who holds it (pid, host,
database, port, as JSON).  A second `relay serve` finds the lock taken and
names the holder from the file (`LockHeld`).  A hard link is another name of
the same file that no path resolves to, so the database file itself is
flocked too (created empty if absent, and removed on release if still empty:
a relay refused at start leaves no database behind); SQLite's own locks are
POSIX record locks, which a flock neither takes nor blocks on Linux.  The
kernel drops a flock when its process dies, however it dies (SIGKILL
included), so a lock never outlives its relay and needs no clean-up; a file
left behind means nothing while nobody holds its lock.

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


LOCK_SUFFIX = ".lock"  # a database's lock file: its file name and this, beside it

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


class DatabaseLock(InstanceLock):
    """The lock of the SQLite database at `db_path` (symbolic links followed): `<real path>.lock`, naming its
    holder, and a flock on the database file itself, which any hard link of it shares (see the module comment)."""

    def __init__(self, db_path: str | Path) -> None:
        self.database = Path(db_path).resolve()
        super().__init__(self.database.with_name(self.database.name + LOCK_SUFFIX), f"database {db_path}",
                         "stop it first, or serve another database (--db)")
        self._db_fd: int | None = None
        self._created = False

    def acquire(self, about: dict) -> None:
        """Take both flocks or raise `LockHeld` (holding neither); the holder of the file's own flock alone (a
        relay on a hard link) is named "pid unknown": its lock file is beside its other name.

        Raises:
            LockHeld: another process holds either.
            OSError: a file cannot be created or opened.
        """
        super().acquire(about)
        try:
            fd, self._created = _open_database(self.database)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise LockHeld(f"{self.what} (through another name: a hard link)", {}, self.advice) from None
        except BaseException:
            super().release()
            raise
        self._db_fd = fd

    def release(self) -> None:
        """Let both locks go, first removing the database file if this lock created it and it is still empty."""
        if self._db_fd is not None:
            if self._created and os.fstat(self._db_fd).st_size == 0:
                self.database.unlink(missing_ok=True)
            os.close(self._db_fd)
            self._db_fd = None
        super().release()


def _open_database(path: Path) -> tuple[int, bool]:
    """(a descriptor of the database file at `path`, whether it was created now, empty)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        pass
    try:
        return os.open(path, os.O_RDWR), False
    except PermissionError:  # refused later by the store, with a better message; a read-only one can flock
        return os.open(path, os.O_RDONLY), False


def is_served(db_path: str | Path) -> bool:
    """Whether a relay holds the lock of the database at `db_path` now (`relay serve` serves it); never waits."""
    database = Path(db_path).resolve()
    try:
        fd = os.open(database.with_name(database.name + LOCK_SUFFIX), os.O_RDONLY)
    except OSError:  # no lock file: no relay ever served it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (drops the shared lock, if taken)
    return False


def database_lock(db_path: str | Path) -> DatabaseLock:
    """The lock of the SQLite database at `db_path` (see `DatabaseLock`)."""
    return DatabaseLock(db_path)


PORT_ADVICE = "choose another port with --port or RELAY_SERVER__PORT (0: any free port)"


def port_lock(port: int) -> InstanceLock:
    """The lock of TCP port `port` (whatever the address): `relay-port-<port>.lock` in the temporary directory."""
    return InstanceLock(Path(tempfile.gettempdir()) / f"relay-port-{port:d}.lock", f"port {port:d}", PORT_ADVICE)


def hold_locks(db: str | Path, port: int) -> list[InstanceLock]:
    """Take the lock of the database at `db`, then that of `port` (none for port 0: the kernel picks a free one);
    the locks held, for `relay serve` to release when it stops.

    Raises:
        LockHeld: the line `relay serve` prints: who holds which, and what to do.
    """
    locks = [database_lock(db)] + ([port_lock(port)] if port != 0 else [])
    about = {"db": str(Path(db).resolve()), "port": port}
    held: list[InstanceLock] = []
    try:
        for lock in locks:
            lock.acquire(about)
            held.append(lock)
    except LockHeld:
        for lock in held:
            lock.release()
        raise
    return held
