"""The state of a relay's database, read-only: what `relay status` prints and the status page shows.

Everything here reads the SQLite file on a connection of its own
(`connect_readonly`: WAL, so a running relay is not disturbed), whether or
not `relay serve` is running.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

from relay.config import Config
from relay.failing import read_failing
from relay.processes import read_processes
from relay.runtime import runtime_dir
from relay.store.checkpoint import file_bytes, wal_bytes
from relay.store.db import connect_readonly
from relay.store.projectors.engine import pending_reason
from relay.store.projectors.tables import quote, read_meta, table_exists
from relay.sync.claims import read_guard_state, shard_states
from relay.sync.guard import FOREIGN
from relay.sync.state import read_states


def gather_status(config: Config) -> dict:
    """The status as a JSON-ready dict.

    Shape: `{"database": {"path", "bytes", "wal_bytes", "schema_version"},
    "events": {"total", "by_kind": {"<kind>": count}}, "projectors": [...],
    "peers": [...]}`, where each projector is as `projector_states` gives it
    and each peer has `url`, `configured` (in `[[sync.peers]]`), `direction`,
    `filter`, and the `sync_peers` columns (unix seconds, counts of events).
    With worker processes running, also `"processes"`: the writer's and each
    worker's pid and start time (relay/processes.py's file).  While background
    steps of the running relay keep failing, also `"failing"`: each as
    `{"step", "error", "attempts", "since", "retry_at"}` (relay/failing.py).  With `[[shards]]` (or projectors'
    `shard_id`s), also `"shards"`: each as `relay.sync.claims.shard_states` gives it, and `"foreign_held_back"`:
    events of no shard held here that the running relay's guard kept in its last round for want of copies.

    Raises:
        FileNotFoundError: there is no database at `store.path`.
        sqlite3.Error: the file is not a readable relay database.
    """
    path = Path(config.store.path)
    if not path.exists():
        raise FileNotFoundError(f"no database at {path}")
    with closing(connect_readonly(path)) as conn:
        return status_of(conn, config)


def status_of(conn: sqlite3.Connection, config: Config) -> dict:
    """`gather_status` read on `conn`, a read-only connection to `config.store.path` the caller holds.

    Raises:
        sqlite3.Error: the file is not a readable relay database.
    """
    path = Path(config.store.path)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    by_kind = conn.execute("SELECT kind, count(*) FROM events GROUP BY kind ORDER BY count(*) DESC, kind")
    kinds = {str(kind): count for kind, count in by_kind}
    states = {s.url: s.as_dict() for s in read_states(conn)}
    projectors = projector_states(conn, config)
    peers = []
    for peer in config.sync.peers:
        row = states.pop(peer.url, {"url": peer.url})
        peers.append({**row, "configured": True, "direction": peer.direction, "filter": json.loads(peer.filter),
                      "pubkey": peer.pubkey or None})
    peers.extend({**row, "configured": False} for row in states.values())
    status = {
        "database": {"path": str(path), "bytes": file_bytes(path), "wal_bytes": wal_bytes(path),
                     "schema_version": version},
        "events": {"total": sum(kinds.values()), "by_kind": kinds},
        "projectors": projectors,
        "peers": peers,
    }
    runtime = runtime_dir(path, create=False)
    processes = read_processes(runtime)
    if processes is not None:
        status["processes"] = processes
    if failing := read_failing(runtime):
        status["failing"] = failing
    held_back = read_guard_state(runtime)  # the running relay's last guard round, by shard id
    if shards := shard_states(conn, config, held_back=held_back):
        status["shards"] = shards
        # events outside every held shard (published here, or handed over) the guard kept for want of copies
        status["foreign_held_back"] = held_back.get(FOREIGN, 0)
    return status


def projector_states(conn: sqlite3.Connection, config: Config) -> list[dict]:
    """Each configured projector, then each one remembered in the database but no longer configured.

    Shape: `{"name", "kind", "revision", "state", "rows", "refusals", "tables"}`;
    `state` is "current", "building (<n> of <N>)" (events, relay/store/projectors/build.py),
    "pending (<why it will be rebuilt>)" or "removed from the configuration (table kept)"; `rows` counts rows of its tables,
    `refusals` the events in the refusal log.
    """
    records = read_meta(conn)
    refused = dict(conn.execute("SELECT projector, count(*) FROM projector_refusals GROUP BY projector")
                   .fetchall()) if has_refusal_log(conn) else {}
    found = [_state(conn, spec.name, spec.kind, spec.revision, refused, pending_reason(spec, records.get(spec.name),
                                                                                      conn), spec.table_names)
             for spec in config.projectors]
    configured = {s.name for s in config.projectors}
    for name, record in sorted(records.items()):
        if name not in configured:
            found.append(_state(conn, name, record.get("kind", "?"), record.get("revision", "?"), refused,
                                "removed from the configuration (table kept)", tuple(record.get("tables", ()))))
    return found


def _state(conn, name, kind, revision, refused, reason, tables) -> dict:
    state = "current" if reason is None else (reason if reason.startswith(("removed", "building"))
                                              else f"pending ({reason})")
    rows = sum(conn.execute(f"SELECT count(*) FROM {quote(t)}").fetchone()[0] for t in tables
               if table_exists(conn, t))
    return {"name": name, "kind": kind, "revision": revision, "state": state, "rows": rows,
            "refusals": refused.get(name, 0), "tables": list(tables)}


def has_refusal_log(conn: sqlite3.Connection) -> bool:
    """Whether the database has the projector refusal log (a store opened with projectors at least once)."""
    return table_exists(conn, "projector_refusals")


def recent_refusals(conn: sqlite3.Connection, projector: str | None, limit: int) -> list[tuple]:
    """The newest `limit` projector refusals (of `projector` only, unless None), newest first:
    (unix seconds, projector, event id, reason); [] without a refusal log."""
    if not has_refusal_log(conn):
        return []
    sql = "SELECT at, projector, event_id, reason FROM projector_refusals"
    params: list = []
    if projector is not None:
        sql += " WHERE projector = ?"
        params.append(projector)
    sql += " ORDER BY seq DESC LIMIT ?"
    params.append(limit)
    return conn.execute(sql, params).fetchall()


def duration(seconds: float) -> str:
    """`seconds` for people: "42 s", "3.5 min", "2.0 h", "1.2 d"."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
