"""Stopping `relay serve` (docs/operating.md, "Shutdown"): Ctrl-C at any moment of its start-up, and a stop while a
command writes through its writer.  Real `relay serve` and `relay import` subprocesses, no mocks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from relay.channel.frames import socket_path
from tests.helpers import Keys
from tests.served import Served, clean_env

_SS_CONNECTED = "03"  # a connected socket's state in /proc/net/unix


@pytest.mark.parametrize("delay", [0.1, 0.3, 0.6, 1.0, None], ids=lambda d: "started" if d is None else f"{d}s")
def test_ctrl_c_at_any_moment_of_start_up_stops_every_process_cleanly(tmp_path, delay):
    """SIGINT to the whole process group of `relay serve --workers 2` (a terminal's Ctrl-C), `delay` seconds
    after it began or once it said `relay_started`: it exits 0 promptly, no process prints a traceback or
    KeyboardInterrupt, no worker is restarted, nothing says it started after the signal, no process is left."""
    with (tmp_path / "serve.stdout").open("wb") as stdout, \
            Served(tmp_path, "--db", tmp_path / "relay.db", "--port", 0, "--workers", 2, env=clean_env(),
                   new_session=True, stdout=stdout) as served:
        if delay is None:
            served.started_url()
        else:
            _until_its_code_runs(served.proc.pid)
            time.sleep(delay)
        asked = datetime.now(timezone.utc)
        os.killpg(served.proc.pid, signal.SIGINT)
        code = served.proc.wait(timeout=30)
        took = (datetime.now(timezone.utc) - asked).total_seconds()
        left = served.group()
    printed = (tmp_path / "serve.stdout").read_text() + served.stderr
    assert code == 0 and took < 10, printed
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed, printed
    events = served.log_events()
    assert not [e for e in events if e["event"] == "worker_restarted"], printed
    late = [e for e in events if e["event"] in ("relay_started", "worker_started")
            and datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")) > asked]
    assert not late, printed
    assert not left


def _until_its_code_runs(pid: int) -> None:
    """Wait until process `pid` runs the relay's first line, which blocks SIGINT (/proc: its SigBlk mask).
    Before it, Python itself starts (tens of milliseconds, more on a busy machine) and a SIGINT raises
    KeyboardInterrupt in Python's own start-up, out of the relay's reach."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        if int(fields["SigBlk"], 16) & (1 << (signal.SIGINT - 1)):
            return
        time.sleep(0.001)
    raise AssertionError("relay serve never blocked SIGINT")


def _channel_connections(db: Path) -> int:
    """Connections the relay's writer accepted on its channel socket (Linux /proc/net/unix: an accepted
    socket bears the listening one's path)."""
    path = str(socket_path(db))
    return sum(line.split()[5] == _SS_CONNECTED and line.split()[-1] == path
               for line in Path("/proc/net/unix").read_text().splitlines()[1:] if len(line.split()) == 8)


@pytest.mark.parametrize(("workers", "sig"), [(2, signal.SIGTERM), (0, signal.SIGINT)],
                         ids=["workers-SIGTERM", "one-process-SIGINT"])
def test_a_stop_while_an_import_writes_through_the_relay_tells_the_import_and_logs_no_traceback(
        tmp_path, workers, sig):
    """`relay import -` fed a few lines by a pipe kept open, connected to the relay's writer: stopping the
    relay exits 0 with no traceback in its log, and the import, its stdin still open, exits 1 with the line
    saying the relay stopped."""
    db, keys = tmp_path / "relay.db", Keys(7)
    with Served(tmp_path, "--db", db, "--port", 0, "--workers", workers, env=clean_env()) as served:
        served.started_url()
        before = _channel_connections(db)
        importing = subprocess.Popen([sys.executable, "-m", "relay", "import", "-", "--db", str(db)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=clean_env())
        try:
            importing.stdin.write(b"".join(json.dumps(keys.sign(1, f"kept open {i}")).encode() + b"\n"
                                           for i in range(3)))
            importing.stdin.flush()
            deadline = time.monotonic() + 30
            while _channel_connections(db) <= before and time.monotonic() < deadline:
                assert importing.poll() is None, importing.stderr.read().decode()
                time.sleep(0.05)
            assert _channel_connections(db) == before + 1
            served.proc.send_signal(sig)
            assert served.proc.wait(timeout=30) == 0, served.stderr
            importing.wait(timeout=30)  # while its input is still open
        finally:
            if importing.poll() is None:
                importing.kill()
                importing.wait()
            importing.stdin.close()
        err = importing.stderr.read().decode()
        importing.stdout.close()
        importing.stderr.close()
    assert "Traceback" not in served.stderr and "CancelledError" not in served.stderr, served.stderr
    assert importing.returncode == 1 and "Traceback" not in err, err
    assert "relay import: the relay serving the database stopped during the import" in err
