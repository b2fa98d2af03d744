"""The processes file: which processes serve a relay now, for `relay status`.

The writer (the parent of the worker processes) keeps `processes.json` in the
relay's runtime directory (relay/runtime.py) and rewrites it whole at each
change (a worker started or restarted), through a temporary file and a
rename, so a reader never sees half of it.  The file outlives a writer
killed with SIGKILL; a reader trusts it only while the writer's pid is alive.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from relay.runtime import replace_json

PROCESSES_FILE = "processes.json"


@dataclass(frozen=True)
class WorkerProcess:
    """One worker: its index (0..N-1), pid, when it (last) started (unix seconds), and times restarted."""

    index: int
    pid: int
    started: float
    restarts: int = 0


def write_processes(runtime: Path, writer_pid: int, writer_started: float, workers: list[WorkerProcess]) -> None:
    """Replace the processes file in `runtime` with the writer's pid and start time (unix seconds) and each
    worker's state.  Shape: `{"writer": {"pid", "started"}, "workers": [{"index", "pid", "started",
    "restarts"}]}`.

    Raises:
        OSError: the file cannot be written.
    """
    body = {"writer": {"pid": writer_pid, "started": writer_started},
            "workers": [asdict(w) for w in sorted(workers, key=lambda w: w.index)]}
    replace_json(runtime / PROCESSES_FILE, body)


def read_processes(runtime: Path) -> dict | None:
    """The processes file in `runtime` (shape as `write_processes` writes it), or None when there is none, it
    cannot be read, or its writer is no longer running (a relay that is not running)."""
    try:
        body = json.loads((runtime / PROCESSES_FILE).read_text(encoding="utf-8"))
        pid = int(body["writer"]["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return body if is_running(pid) else None


def is_running(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0 checks without sending anything)."""
    if pid <= 0:  # 0 and negative pids name process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int) -> None:
    """Ask Linux for signal `signum` in this process when its parent dies, however it dies (prctl
    PR_SET_PDEATHSIG; it fires when the thread that made this process ends); elsewhere nothing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    except (OSError, AttributeError):
        pass
