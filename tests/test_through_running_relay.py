"""Command-line writes through a running relay's writer (relay/commands/through.py): `relay import` beside a
relay of one process, `relay record put` beside a relay of worker processes; their events reach live
subscribers.  Real `relay serve` subprocesses, real WebSocket clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

from relay.commands.transfer import CHUNK_LINES
from tests.helpers import Client, Keys, eventually
from tests.served import Served, clean_env, relay_cli, relay_cli_async
from tests.server.test_workers import _close_all, _serve, _start, _subscribed_on_every_worker, _until
from tests.server.test_workers_shared import _metrics


async def test_relay_import_beside_a_one_process_relay_reaches_its_subscriber(tmp_path):
    """`relay serve --workers 0` and a subscriber: `relay import` goes through the relay's writer, and the
    subscriber gets every imported event live."""
    keys = Keys(91)
    imported = [keys.sign(1, f"imported {i}") for i in range(5)]
    lines = tmp_path / "events.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in imported))
    db = tmp_path / "relay.db"
    with Served(tmp_path, "--db", db, "--port", "0", "--workers", "0", env=clean_env()) as served:
        port = await asyncio.to_thread(_start, served)
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        try:
            assert await client.req("live", {"authors": [keys.pubkey]}) == []
            code, _, err = await relay_cli_async("import", lines, "--db", db)
            assert code == 0, err
            got = await _until(client, "live", imported[-1]["id"])
            assert sorted(got) == sorted(e["id"] for e in imported)
        finally:
            await client.close()


async def _put(db, key_file, name: str) -> tuple[int, dict]:
    """`relay record put profiles` of `name`: its exit code and output."""
    code, out, err = await relay_cli_async("record", "put", "profiles", "--row", json.dumps({"name": name}),
                                           "--key", key_file, "--db", db)
    assert code in (0, 1), err  # 1: refused, when the other put's newer version was stored first
    return code, json.loads(out)


async def test_relay_record_put_goes_through_the_running_writer_to_every_worker(tmp_path):
    """`relay record put` beside `relay serve --workers 2`: a subscriber on each worker gets the event; two
    puts at once on one coordinate get distinct created_at, and the later one reaches every worker and is
    the row; the relay's writer committed them (its relay_events_stored_total)."""
    secret = bytes(range(2, 34))
    db, key_file = tmp_path / "relay.db", tmp_path / "app.key"
    key_file.write_text(secret.hex() + "\n")
    key_file.chmod(0o600)
    keys = Keys(secret)
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _subscribed_on_every_worker(port, keys)
        try:
            code, written = await _put(db, key_file, "first")
            assert code == 0 and written["accepted"] is True
            for client in clients.values():
                assert await _until(client, "live", written["event"]["id"]) == [written["event"]["id"]]
            runs = await asyncio.gather(_put(db, key_file, "a"), _put(db, key_file, "b"))
            events = [w["event"] for _, w in runs]
            assert events[0]["created_at"] != events[1]["created_at"]
            newest = max(events, key=lambda e: e["created_at"])
            assert next(w for _, w in runs if w["event"] is newest)["accepted"] is True
            for client in clients.values():
                assert newest["id"] in await _until(client, "live", newest["id"])
            stored = 1 + sum(w["accepted"] for _, w in runs)  # committed by the relay's writer, not the command's
            assert await eventually(lambda: _metrics(port).get("relay_events_stored_total") == stored)
            code, out, err = await relay_cli_async("record", "get", "profiles", "--pk",
                                                   json.dumps({"pubkey": keys.pubkey}), "--db", db)
            assert code == 0 and json.loads(out)["_event_id"] == newest["id"], err
        finally:
            await _close_all(clients.values())


@contextlib.asynccontextmanager
async def _importer(db):
    """`relay import - --db DB` reading a pipe the test writes; killed on the way out if still running."""
    importer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relay", "import", "-", "--db", str(db), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env())
    try:
        yield importer
    finally:
        if importer.returncode is None:
            importer.kill()
            await importer.wait()


async def test_an_import_whose_relay_dies_on_the_way_exits_1_saying_so(tmp_path):
    """The writer of the relay an import goes through is SIGKILLed mid-import: the lines after it are answered
    "error:", and the import exits 1 saying they may or may not be stored (it once exited 0, calling them
    rejected)."""
    keys = Keys(92)
    db = tmp_path / "relay.db"
    with Served(tmp_path, "--db", db, "--port", "0", "--workers", "0", env=clean_env()) as served:
        port = await asyncio.to_thread(_start, served)
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        assert await client.req("live", {"authors": [keys.pubkey]}) == []
        async with _importer(db) as importer:
            chunk = [keys.sign(1, f"before the relay died {i}") for i in range(CHUNK_LINES)]  # one chunk goes now
            importer.stdin.write(b"".join(json.dumps(e).encode() + b"\n" for e in chunk))
            await importer.stdin.drain()
            assert len(await _until(client, "live", chunk[-1]["id"])) == CHUNK_LINES  # through the relay
            served.proc.kill()
            await asyncio.to_thread(served.proc.wait, 10)
            importer.stdin.write(json.dumps(keys.sign(1, "after")).encode() + b"\n")
            importer.stdin.close()
            out, err = await asyncio.wait_for(importer.communicate(), 30)
        await client.close()
    assert importer.returncode == 1, (out, err)
    assert b"stopped during the import" in err


def test_a_command_refuses_to_write_beside_a_relay_whose_channel_is_gone(tmp_path):
    """A relay holds the database's lock but its channel socket was removed (a temporary-directory cleaner):
    `relay import` refuses (exit 2, naming the socket) instead of writing beside the relay's writer."""
    from relay.channel.frames import socket_path

    db = tmp_path / "relay.db"
    lines = tmp_path / "events.jsonl"
    lines.write_text(json.dumps(Keys(93).sign(1, "beside")) + "\n")
    with Served(tmp_path, "--db", db, "--port", "0", "--workers", "0", env=clean_env()) as served:
        _start(served)
        socket_path(db).unlink()
        proc = relay_cli("import", lines, "--db", db)
    assert proc.returncode == 2, proc
    assert "channel" in proc.stderr and "cannot be reached" in proc.stderr


async def test_a_piped_import_reaches_the_relay_before_the_pipe_closes(tmp_path):
    """`producer | relay import -` beside a serving relay: lines written to a pipe kept open reach a REQ on the
    relay within seconds, not when the pipe closes."""
    keys = Keys(94)
    db = tmp_path / "relay.db"
    with Served(tmp_path, "--db", db, "--port", "0", "--workers", "0", env=clean_env()) as served:
        port = await asyncio.to_thread(_start, served)
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        async with _importer(db) as importer:
            piped = [keys.sign(1, f"piped {i}") for i in range(3)]
            importer.stdin.write(b"".join(json.dumps(e).encode() + b"\n" for e in piped))
            await importer.stdin.drain()

            async def stored() -> bool:
                return len(await client.req("piped", {"authors": [keys.pubkey]})) == len(piped)

            assert await eventually(stored, timeout=10)
            assert importer.returncode is None  # the pipe is still open
            importer.stdin.close()
            out, err = await asyncio.wait_for(importer.communicate(), 30)
        await client.close()
    assert importer.returncode == 0 and b"stored 3" in out, (out, err)
