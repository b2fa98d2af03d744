"""A projector built while `relay serve` serves (relay/store/projectors/build.py, background.py): /health answers,
its table answers 503 with the progress, `relay status` shows `building (n of N)`, `relay verify` and `relay query`
exit 3; after a SIGKILL the build resumes from its checkpoint instead of starting over."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import shutil
import sqlite3
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from relay.node import open_store
from relay.protocol.event import EventLimits, parse_event
from relay.store.projectors.tables import build_progress
from tests.conftest import make_config
from tests.served import Served, free_port, http_get, relay_cli

NOTES = 30_000
"""Events of the projector's kind: built in steps of a few events, the build lasts seconds."""


def _note(i: int) -> dict:
    # Stored straight through the store's writer, which checks ids but not signatures (ingest does).
    pubkey = f"{i % 50 + 1:064x}"
    body = [0, pubkey, 1_700_000_000 + i, 1, [], f"note {i}"]
    event_id = hashlib.sha256(orjson.dumps(body)).hexdigest()
    return {"id": event_id, "pubkey": pubkey, "created_at": body[2], "kind": 1, "tags": [], "content": body[5],
            "sig": "00" * 64}


def stored_without_projectors(directory: Path, events: list[dict]) -> Path:
    """A database in `directory` holding `events` (signatures unchecked) and no projector; returns its path."""
    config = dataclasses.replace(make_config(directory), projectors=())

    async def fill():
        store = await open_store(config)
        limits, now = EventLimits(), time.time()
        for start in range(0, len(events), 5000):
            await asyncio.gather(*(store.submit(parse_event(e, limits, now)) for e in events[start:start + 5000]))
        await store.close()

    asyncio.run(fill())
    return Path(config.store.path)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """A database of NOTES kind-1 events and no projector (written once per module, copied by each test)."""
    return stored_without_projectors(tmp_path_factory.mktemp("big"), [_note(i) for i in range(NOTES)])


def _config(tmp_path: Path, big_store: Path, batch: int) -> tuple[Path, int]:
    """A copy of the big store and a config that adds the `notes` projector, built `batch` events a step;
    (config file, port)."""
    db = tmp_path / "relay.db"
    shutil.copy(big_store, db)
    port = free_port()
    config = tmp_path / "relay.toml"
    config.write_text(f"""
[server]
port = {port}
[store]
path = "{db}"
projector_build_batch = {batch}
[http]
tables = true
[[projectors]]
table = "notes"
kind = 1
primary_key = ["id"]
fields = [{{name = "id", type = "TEXT", source = "id"}}, {{name = "body", type = "TEXT", source = "content"}}]
""")
    return config, port


def _progress(tmp_path: Path, projector: str = "notes") -> dict | None:
    """The build progress of `projector` in `tmp_path/relay.db`, read-only (None when it is not being built)."""
    conn = sqlite3.connect(f"file:{tmp_path / 'relay.db'}?mode=ro", uri=True)
    try:
        return build_progress(conn, projector)
    finally:
        conn.close()


def _table(port: int) -> tuple[int, dict]:
    try:
        status, _, body = http_get(port, "/tables/notes?limit=1", timeout=5.0)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, json.loads(body)


def _wait(check, timeout: float = 120.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return value


def test_a_relay_serves_while_a_projector_is_built(tmp_path, big_store):
    """/health answers while the meta record says building; the table, status, verify and query say so; at the
    end the table is complete and verify is clean."""
    config, port = _config(tmp_path, big_store, 1)  # long enough for three CLI runs
    with Served(tmp_path, "--config", config) as served:
        served.wait_health(port)
        assert http_get(port, "/health")[0] == 200  # listening: the build did not hold the start back
        progress = _progress(tmp_path)
        assert progress is not None and progress["total"] == NOTES, progress  # answered during the build
        status, body = _table(port)
        assert status == 503 and body["error"] == "building", body
        assert set(body["progress"]) == {"done", "total"} and body["progress"]["total"] == NOTES
        with ThreadPoolExecutor(4) as pool:  # at once: the build goes on meanwhile
            status, listed, verify, query = pool.map(lambda args: relay_cli(*args, "--config", config), [
                ("status", "--json"), ("projectors", "list"), ("verify",), ("query", "notes")])
        assert f" of {NOTES})" in next(line for line in listed.stdout.splitlines() if line.startswith("notes "))
        state = json.loads(status.stdout)["projectors"][0]["state"]
        assert state.startswith("building (") and state.endswith(f" of {NOTES})"), state
        assert verify.returncode == 3, verify.stdout + verify.stderr
        assert "notes: building (" in verify.stdout
        assert query.returncode == 3 and "notes is being built" in query.stderr, query.stderr
        _wait(lambda: _table(port)[0] == 200)
        assert _table(port)[1]["rows"], "the finished table has rows"
    verify = relay_cli("verify", "--config", config)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"notes: ok, {NOTES} rows" in verify.stdout


def test_a_build_killed_mid_way_resumes_from_its_checkpoint(tmp_path, big_store):
    """SIGKILL after some steps; the restarted relay reads only the events after the checkpoint."""
    config, port = _config(tmp_path, big_store, 10)
    with Served(tmp_path, "--config", config) as served:
        served.wait_health(port)
        _wait(lambda: (_progress(tmp_path) or {}).get("done", 0) >= 1000)
        served.kill()
    done = _progress(tmp_path)["done"]
    assert 1000 <= done < NOTES
    with Served(tmp_path, "--config", config) as served:
        served.wait_health(port)
        _wait(lambda: _table(port)[0] == 200)
        logs = {entry["event"]: entry for entry in served.log_events()}
    assert "projector_build_started" not in logs  # not from the start again
    assert logs["projector_build_resumed"]["events_done"] == done
    assert logs["projector_build_finished"]["events_read"] == NOTES - done
    verify = relay_cli("verify", "--config", config)
    assert verify.returncode == 0, verify.stdout + verify.stderr
