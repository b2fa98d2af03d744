"""`relay record put | delete | get`: rows of a declared projector from the command line (relay/ingest/records.py).

Output is JSON on stdout: `put` and `delete` print `{"event": <the signed event>, "accepted": bool, "message":
"<OK message>"}`, `get` the row (an object; read-only, relay/commands/record_get.py).  Exit codes: 0 done; 1
refused by ingest or the store (the OK message on stderr), or (`get`) no database; 2 a usage error, an unknown
table or column, a row no event projects to (named); 3 not available (`get`: no such row, or the table is being
built; a `rate-limited:` refusal with `--no-wait`; a `created_at` too far ahead; a key file that does not exist
or cannot be read).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson

from relay.commands.record_get import run_get
from relay.commands.through import open_write_path
from relay.config import Config
from relay.ingest.records import RecordApi, Written
from relay.keys import NodeKeyError, load_or_create
from relay.protocol.rejection import Rejection
from relay.store.records import RecordQueryError

NOT_AVAILABLE = 3


@asynccontextmanager
async def open_records(config: Config) -> AsyncIterator[RecordApi]:
    """The records of `config`'s database, for one command.

    The one place that chooses how a command reaches the writer (relay/commands/through.py): when a relay
    serves the database, through its writer (the created_at reservation a `job`, the signed event a `submit`,
    so its live subscribers get it), else the store opened here with its hooks, as `relay import` does.
    Either way the reservation is one writer transaction, so created_at stays distinct per coordinate.
    """
    path = await open_write_path(config, read_connections=1)
    store = path.store
    ingest = await path.ingest(config)  # bans
    try:
        yield RecordApi.from_config(config, store, ingest)
    finally:
        await ingest.aclose()
        await path.close()


async def run_record(config: Config, action: str, table: str, data: object, key_file: Path | None = None,
                     created_at: int | None = None, wait: bool = True, reason: str = "") -> int:
    """`relay record ACTION TABLE`: `data` is the row (put: an object, or a list for a one-row-per-tag table)
    or the key (delete, get: an object of key columns); see the module docstring for output and exit codes."""
    if action == "get":
        return run_get(config, table, data)
    if key_file is not None and not key_file.exists():  # a typo must not sign with a new key
        print(f"relay record: no such key file: {key_file} (create one with `relay key --file {key_file}`)",
              file=sys.stderr)
        return NOT_AVAILABLE
    try:
        key = load_or_create(key_file) if key_file is not None else None
    except NodeKeyError as exc:
        print(f"relay record: {exc}", file=sys.stderr)
        return NOT_AVAILABLE
    async with open_records(config) as records:
        try:
            if action == "put":
                written = await records.put_record(table, data, key, created_at, wait=wait)
            else:
                written = await records.delete_record(table, key, pk=data, reason=reason)
        except RecordQueryError as exc:  # (RowRefused too)
            print(f"relay record: {exc}", file=sys.stderr)
            return 2
        except (Rejection, NodeKeyError) as exc:  # rate-limited with --no-wait; the node key unreadable
            print(f"relay record: {exc}", file=sys.stderr)
            return NOT_AVAILABLE
    return _report(written)


def _report(written: Written) -> int:
    outcome = written.outcome
    sys.stdout.write(orjson.dumps({"event": written.event, "accepted": outcome.accepted,
                                   "message": outcome.message}).decode() + "\n")
    if not outcome.accepted:
        print(f"relay record: {outcome.message}", file=sys.stderr)
        return 1
    return 0
