"""The failing file: background steps of the writer that keep failing, for `relay status`.

A step (one projector build step, one expiry purge, one retention or ban
purge step) that raises is tried again with back-off (`Store.run_retried`);
while it fails, the writer keeps `failing.json` in the relay's runtime
directory (relay/runtime.py) listing it, rewritten whole at each change
through a temporary file and a rename.  A reader trusts the file only while
the process that wrote it is alive, as it does the processes file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from relay.processes import is_running
from relay.runtime import replace_json, runtime_dir

FAILING_FILE = "failing.json"


@dataclass(frozen=True)
class Failing:
    """One failing step: what it is, its last error, failures in a row, since and next try (unix seconds)."""

    step: str
    error: str
    attempts: int
    since: float
    retry_at: float


class FailingSteps:
    """The failing steps of the writer serving the database at `db_path`; the file exists only while one does."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.steps: dict[str, Failing] = {}

    def failed(self, step: str, error: str, attempts: int, retry_in_seconds: float) -> None:
        """`step` failed `attempts` times in a row, the last with `error`; it is tried again in `retry_in_seconds`."""
        now = time.time()
        since = self.steps[step].since if step in self.steps else now
        self.steps[step] = Failing(step, error, attempts, since, now + retry_in_seconds)
        self._write()

    def recovered(self, step: str) -> None:
        """`step` succeeded: no longer listed."""
        if self.steps.pop(step, None) is not None:
            self._write()

    def _write(self) -> None:
        try:
            runtime = runtime_dir(self.db_path)
            if self.steps:
                replace_json(runtime / FAILING_FILE, {"pid": os.getpid(),
                                                      "steps": [asdict(f) for f in self.steps.values()]})
            else:
                (runtime / FAILING_FILE).unlink(missing_ok=True)
        except OSError:  # status only: the log line of each failure says the same
            pass


def read_failing(runtime: Path) -> list[dict]:
    """The failing steps listed in `runtime` (each as `Failing` fields), or [] when none is, the file cannot be
    read, or its writer is no longer running."""
    try:
        body = json.loads((runtime / FAILING_FILE).read_text(encoding="utf-8"))
        pid, steps = int(body["pid"]), list(body["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return steps if is_running(pid) else []
