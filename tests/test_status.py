"""`relay status` and `relay status --json`: database size, events by kind, projectors, sync peers."""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from relay.commands.status import run_status
from relay.processes import PROCESSES_FILE, WorkerProcess, write_processes
from relay.runtime import runtime_dir
from relay.store.location import DatabaseUnusable
from relay.store.projectors.spec import parse_specs
from relay.sync.state import add_counts, record_error
from tests.conftest import make_config
from tests.helpers import Client, Keys
from tests.inprocess import Relay
from tests.served import CLI_TIMEOUT, clean_env

CONFIGURED = "ws://configured.example"
FORMER = "ws://former.example"  # synced once (sync_peers row), no longer in [[sync.peers]]


@pytest.fixture
async def status_config(tmp_path):
    """A database written by a real relay, and a Config that keeps profiles, adds `notes` and drops the rest."""
    config = make_config(tmp_path)
    relay = Relay(config)
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        for event in (Keys(1).sign(kind=0, content='{"name": "one"}'), Keys(2).sign(kind=0, content="not JSON"),
                      *(Keys(1).sign(content=f"note {i}") for i in range(3)), Keys(1).sign(kind=7, content="+")):
            assert (await client.publish(event))[2] is True
    finally:
        await client.close()
        await relay.stop()
    with sqlite3.connect(config.store.path) as conn:
        add_counts(conn, FORMER, 12, 5, success_at=1_700_000_000)
        record_error(conn, FORMER, 1_700_000_100, "peer went away")
    notes = parse_specs([{"table": "notes", "kind": 1, "primary_key": ["id"],
                          "fields": [{"name": "id", "type": "TEXT", "source": "id"}]}])
    peers = make_config(tmp_path, sync={"peers": [{"url": CONFIGURED, "direction": "down",
                                                   "filter": {"kinds": [1]}}]}).sync
    return dataclasses.replace(config, projectors=(config.projectors[0], *notes), sync=peers)


def test_status_json_has_sizes_kinds_projectors_and_peers(status_config, capsys):
    """--json: db and WAL sizes, events by kind, every projector's state, configured and former peers."""
    assert run_status(status_config, as_json=True) == 0
    status = json.loads(capsys.readouterr().out)
    db = status["database"]
    assert db["path"] == status_config.store.path and db["bytes"] > 0 and db["wal_bytes"] >= 0
    assert db["schema_version"] >= 4
    assert status["events"] == {"total": 6, "by_kind": {"1": 3, "0": 2, "7": 1}}
    by_name = {p["name"]: p for p in status["projectors"]}
    assert by_name["profiles"] == {"name": "profiles", "kind": 0, "revision": 1, "state": "current", "rows": 1,
                                   "refusals": 1, "tables": ["profiles"]}
    assert by_name["notes"]["state"] == "pending (new)" and by_name["notes"]["rows"] == 0
    for name in ("follows", "relay_lists", "articles"):
        assert by_name[name]["state"] == "removed from the configuration (table kept)"
    assert [p["name"] for p in status["projectors"]][:2] == ["profiles", "notes"]  # configured ones first
    configured, former = status["peers"]
    assert configured["url"] == CONFIGURED and configured["configured"] is True
    assert (configured["direction"], configured["filter"]) == ("down", {"kinds": [1]})
    assert former["url"] == FORMER and former["configured"] is False
    assert (former["events_in"], former["events_out"], former["last_success"]) == (12, 5, 1_700_000_000)
    assert (former["last_error"], former["last_error_at"]) == ("peer went away", 1_700_000_100)


def test_status_text_shows_the_same(status_config, capsys):
    """Without --json: one readable line per kind, projector and peer fact."""
    assert run_status(status_config, as_json=False) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"database {status_config.store.path}: ") and "WAL" in lines[0]
    assert lines[1:5] == ["events: 6", "  kind     1: 3", "  kind     0: 2", "  kind     7: 1"]
    assert lines.index("projectors: 5") > lines.index("sync peers: 2")  # after the peers
    assert "  profiles (kind 0, revision 1): current, 1 rows, 1 refusals" in lines
    assert "  notes (kind 1, revision 1): pending (new), 0 rows, 0 refusals" in lines
    assert ("  follows (kind 3, revision 1): removed from the configuration (table kept), 0 rows, 0 refusals"
            in lines)
    assert "sync peers: 2" in lines
    assert f'  {CONFIGURED} (down, filter {{"kinds": [1]}})' in lines
    assert f"  {FORMER} (not configured)" in lines
    assert "    events in 12, out 5" in lines
    assert any(line.startswith("    last error ") and line.endswith(": peer went away") for line in lines)


def test_status_without_a_database_is_refused_naming_it(tmp_path, capsys):
    """No file at store.path: DatabaseUnusable naming its path (the command line's exit 2), nothing printed."""
    config = make_config(tmp_path / "none")
    with pytest.raises(DatabaseUnusable, match="no such database"):
        run_status(config, as_json=True)
    assert capsys.readouterr() == ("", "")


def test_status_into_a_closed_pipe_exits_1_without_a_traceback(status_config):
    """`relay status --json | head -c 0`: the reader is gone before the first write; exit 1, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "relay", "status", "--json", "--db", status_config.store.path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    proc.stdout.close()  # before the interpreter has even started: its writes all fail with EPIPE
    _, err = proc.communicate(timeout=CLI_TIMEOUT)
    assert proc.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err


def test_status_shows_each_process_of_a_running_relay(status_config, capsys):
    """With a processes file whose writer is alive, --json and the text list the writer and each worker; once
    its writer is gone, the file is ignored (a relay that is not running)."""
    runtime = runtime_dir(status_config.store.path)
    workers = [WorkerProcess(1, 4243, 1_700_000_060.0, restarts=2), WorkerProcess(0, 4242, 1_700_000_001.0)]
    write_processes(runtime, os.getpid(), 1_700_000_000.0, workers)
    try:
        assert run_status(status_config, as_json=True) == 0
        assert json.loads(capsys.readouterr().out)["processes"] == {
            "writer": {"pid": os.getpid(), "started": 1_700_000_000.0},
            "workers": [{"index": 0, "pid": 4242, "started": 1_700_000_001.0, "restarts": 0},
                        {"index": 1, "pid": 4243, "started": 1_700_000_060.0, "restarts": 2}]}
        assert run_status(status_config, as_json=False) == 0
        lines = capsys.readouterr().out.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("processes: "))
        assert lines[first].startswith(f"processes: writer pid {os.getpid()}, started ")
        assert lines[first].endswith("; 2 workers")
        assert lines[first + 1].startswith("  worker 0: pid 4242, started ")
        assert lines[first + 2].endswith("restarts 2")

        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        write_processes(runtime, int(gone.stdout), 1_700_000_000.0, workers)
        assert run_status(status_config, as_json=True) == 0
        assert "processes" not in json.loads(capsys.readouterr().out)
    finally:
        (runtime / PROCESSES_FILE).unlink()
