"""The runtime directory of a relay serving one database: its local channel socket, shared limits and metrics files.

`runtime_dir(db_path)` is `relay-<hash>` in the temporary directory, the hash
being of the database's real path (every path of one database, symbolic
links included, names one directory, as its lock does: relay/locks.py), so
the processes of one relay, and the command-line tools run beside it, find
each other from the database path alone.  It is short enough for an AF_UNIX
socket path (at most 107 bytes on Linux) whatever the database's path, and
is created with mode 0700: only the relay's user may talk to its writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def runtime_dir(db_path: str | Path, create: bool = True) -> Path:
    """The runtime directory of the relay serving the database at `db_path` (created 0700 if `create`).

    Raises:
        OSError: the directory cannot be created, or exists and is not this user's alone.
    """
    digest = hashlib.sha256(os.fsencode(Path(db_path).resolve())).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"relay-{digest}"
    if create:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise OSError(f"{path} is not private to this user (mode {info.st_mode & 0o777:o})")
    return path


def replace_json(path: Path, body: object) -> None:
    """Replace the file `path` with `body` as JSON, through a temporary file and a rename: a reader never sees
    half of it.

    Raises:
        OSError: the file cannot be written.
    """
    temporary = path.with_name(f"{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(body), encoding="utf-8")
    os.replace(temporary, path)
