"""A writer killed with SIGKILL in the middle of a batch leaves events and projections consistent: after a
restart `relay verify` is clean (the projected rows commit in the same transaction as the events)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from relay.store.projectors import BUILTIN_PROJECTORS
from tests.store.projectors.common import open_store, rows

REPO = Path(__file__).resolve().parents[3]


def test_sigkill_mid_batch_leaves_events_and_projections_consistent(tmp_path):
    """Kill the writer at a random moment after a few commits; restart; verify finds no difference."""
    db = tmp_path / "relay.db"
    child = subprocess.Popen([sys.executable, "-m", "tests.store.projectors.kill_writer", str(db)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        seen = 0
        while seen < 3 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            seen += line.startswith("batch ")
        assert seen == 3, "the writer did not commit three batches"
        time.sleep(random.uniform(0.0, 0.15))  # somewhere inside the next batches
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        child.stdout.close()

    async def restart():
        store, hook = await open_store(db)
        await store.close()
        return hook

    hook = asyncio.run(restart())
    assert hook.rebuilt == []  # nothing to redo: the projections committed with their events
    assert rows(db, "SELECT count(*) FROM events")[0][0] >= 100
    assert rows(db, "SELECT count(*) FROM follows")[0][0] > 0
    verify = subprocess.run([sys.executable, "-m", "relay", "verify", "--db", str(db)], cwd=REPO,
                            capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if not k.startswith("RELAY_")})
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "4 of 4 projected tables agree" in verify.stdout
    assert len(BUILTIN_PROJECTORS) == 4
