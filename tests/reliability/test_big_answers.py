"""Many concurrent REQs for large stored answers to one `relay serve` subprocess: its memory stays within
what the configured bounds allow (the relay-wide budget for unsent results, `max_query_bytes` per read
connection), and each answer is the newest events that fit in `max_query_bytes`, or refused `rate-limited:`."""

from __future__ import annotations

import asyncio
import json

import websockets

from tests.helpers import Keys
from tests.reliability.overload import status_bytes
from tests.served import Served, clean_env, relay_cli

CLIENTS = 60
EVENTS = 400  # of 30 kB content each: 12 MB stored, every one in each answer but for the byte bound
CONTENT_BYTES = 30_000
MAX_QUERY_BYTES = 1_048_576  # its least: limits.max_message_bytes
BUDGET_BYTES = 8_388_608  # limits.max_stored_results_bytes
READ_CONNECTIONS, READ_CACHE_BYTES = 4, 16 * 1024 * 1024  # store.read_connections; a read connection's page cache
# (at most: it never holds more than the database file)
CHUNK_BYTES = 262_144 + 64 * 32  # one write of stored results: 256 KiB of events (relay/server/outbox.py), framed
PER_CONNECTION_BYTES = 96 * 1024 + 3 * CHUNK_BYTES  # its objects; a chunk as raw, framed and in the transport
TOML = f"""\
[limits]
max_query_bytes = {MAX_QUERY_BYTES}
max_stored_results_bytes = {BUDGET_BYTES}
[rate_limits]
enabled = false
"""


async def _answer(url: str) -> tuple[str, list[str], str]:
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps(["REQ", "all", {"limit": 5000}]))
        ids = []
        while True:
            message = json.loads(await ws.recv())
            if message[0] == "EVENT":
                ids.append(message[2]["id"])
            elif message[0] in ("EOSE", "CLOSED"):
                return message[0], ids, message[2] if message[0] == "CLOSED" else ""


async def test_concurrent_large_answers_stay_within_the_memory_bound(tmp_path):
    """60 REQs at once for 12 MB each: answers cut to `max_query_bytes` (or `rate-limited:`), and peak RSS -
    idle < 2 budgets + per read connection 3 answers of `max_query_bytes` and its page cache (at most the
    database) + per client 96 kB and 3 chunks.  Without the byte bound a read connection alone would hold
    three 12 MB answers; this bound is what the configuration allows, not a tight estimate."""
    keys = Keys(41)
    events = [keys.sign(content="x" * CONTENT_BYTES, created_at=1_700_000_000 + i) for i in range(EVENTS)]
    source, config_path, db = tmp_path / "big.jsonl", tmp_path / "relay.toml", tmp_path / "relay.db"
    source.write_text("".join(json.dumps(e) + "\n" for e in events))
    config_path.write_text(TOML)
    imported = relay_cli("import", "--create", source, "--db", db, "--config", config_path)
    assert imported.returncode == 0 and f"stored {EVENTS}," in imported.stdout, imported.stdout + imported.stderr
    newest_first = [e["id"] for e in reversed(events)]
    fitting = MAX_QUERY_BYTES // len(json.dumps(events[0], separators=(",", ":")))
    with Served(tmp_path, "--config", config_path, "--db", db, "--port", 0, env=clean_env()) as served:
        url = served.started_url()
        await _answer(url)  # warm: imports, page cache
        idle = status_bytes(served.proc.pid, "VmRSS")
        answers = await asyncio.gather(*(_answer(url) for _ in range(CLIENTS)))
        peak = status_bytes(served.proc.pid, "VmHWM")
    whole = [ids for verb, ids, _ in answers if verb == "EOSE"]
    refused = [reason for verb, _, reason in answers if verb == "CLOSED"]
    assert whole and all(ids == newest_first[:fitting] for ids in whole)
    assert all(reason.startswith("rate-limited:") for reason in refused), refused
    page_cache = min(READ_CACHE_BYTES, db.stat().st_size)
    bound = (2 * BUDGET_BYTES + READ_CONNECTIONS * (3 * MAX_QUERY_BYTES + page_cache)
             + CLIENTS * PER_CONNECTION_BYTES)
    assert peak - idle < bound, f"peak RSS {peak} - idle {idle} >= bound {bound}"
