"""`relay status`: database size, events by kind, projectors, and each sync peer's state, read-only.

Reads the SQLite file directly (read-only, WAL: a running relay is not
disturbed), so it works whether or not `relay serve` is running.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

from relay.config import Config
from relay.commands.projectors import projector_states
from relay.store.checkpoint import file_bytes, wal_bytes
from relay.sync.state import read_states


def gather_status(config: Config) -> dict:
    """The status as a JSON-ready dict.

    Shape: `{"database": {"path", "bytes", "wal_bytes", "schema_version"},
    "events": {"total", "by_kind": {"<kind>": count}}, "projectors": [...],
    "peers": [...]}`, where each projector is as `projector_states` gives it
    and each peer has `url`, `configured` (in `[[sync.peers]]`), `direction`,
    `filter`, and the `sync_peers` columns (unix seconds, counts of events).

    Raises:
        FileNotFoundError: there is no database at `store.path`.
        sqlite3.Error: the file is not a readable relay database.
    """
    path = Path(config.store.path)
    if not path.exists():
        raise FileNotFoundError(f"no database at {path}")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        by_kind = conn.execute("SELECT kind, count(*) FROM events GROUP BY kind ORDER BY count(*) DESC, kind")
        kinds = {str(kind): count for kind, count in by_kind}
        states = {s.url: s.as_dict() for s in read_states(conn)}
        projectors = projector_states(conn, config)
    finally:
        conn.close()
    peers = []
    for peer in config.sync.peers:
        row = states.pop(peer.url, {"url": peer.url})
        peers.append({**row, "configured": True, "direction": peer.direction, "filter": json.loads(peer.filter),
                      "pubkey": peer.pubkey or None})
    peers.extend({**row, "configured": False} for row in states.values())
    return {
        "database": {"path": str(path), "bytes": file_bytes(path), "wal_bytes": wal_bytes(path),
                     "schema_version": version},
        "events": {"total": sum(kinds.values()), "by_kind": kinds},
        "projectors": projectors,
        "peers": peers,
    }


def _when(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "never"
    ago = now - seconds
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    if ago >= 0:
        return f"{stamp} ({_duration(ago)} ago)"
    return f"{stamp} (in {_duration(-ago)})"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def render_status(status: dict, now: float | None = None, top_kinds: int = 15) -> str:
    """The status as readable text (what `relay status` prints without --json)."""
    now = time.time() if now is None else now
    d, events = status["database"], status["events"]
    lines = [f"database {d['path']}: {_mib(d['bytes'] + d['wal_bytes'])} "
             f"(file {_mib(d['bytes'])}, WAL {_mib(d['wal_bytes'])}), schema version {d['schema_version']}",
             f"events: {events['total']}"]
    kinds = list(events["by_kind"].items())
    for kind, count in kinds[:top_kinds]:
        lines.append(f"  kind {kind:>5}: {count}")
    if len(kinds) > top_kinds:
        lines.append(f"  ... {len(kinds) - top_kinds} more kinds: {sum(c for _, c in kinds[top_kinds:])}")
    lines.append(f"sync peers: {len(status['peers'])}" + ("" if status["peers"] else " (none configured)"))
    for p in status["peers"]:
        scope = f"{p['direction']}, filter {json.dumps(p['filter'])}" if p["configured"] else "not configured"
        lines.append(f"  {p['url']} ({scope})")
        lines.append(f"    last success {_when(p.get('last_success'), now)}; "
                     f"last attempt {_when(p.get('last_attempt'), now)}")
        lines.append(f"    events in {p.get('events_in', 0)}, out {p.get('events_out', 0)}"
                     + (f", pushed up to change {p['push_cursor']}" if p.get("push_cursor") is not None else ""))
        if p.get("lasting_differences"):
            lines.append(f"    lasting differences {p['lasting_differences']}: ids found different by the last two "
                         "reconciliations (refused on one side; the log names them)")
        if p.get("last_error"):
            lines.append(f"    last error {_when(p.get('last_error_at'), now)}: {p['last_error']}")
        if p.get("lease_owner") and (p.get("lease_expires") or 0) > now:
            lines.append(f"    syncing now: {p['lease_owner']} (lease until {_when(p['lease_expires'], now)})")
    lines.append(f"projectors: {len(status['projectors'])}" + ("" if status["projectors"] else " (none configured)"))
    for p in status["projectors"]:
        lines.append(f"  {p['name']} (kind {p['kind']}, revision {p['revision']}): {p['state']}, {p['rows']} rows, "
                     f"{p['refusals']} refusals")
    return "\n".join(lines)


def run_status(config: Config, as_json: bool) -> int:
    """`relay status [--json]`: print the status; exit 1 when there is no readable database."""
    try:
        status = gather_status(config)
    except (FileNotFoundError, sqlite3.Error) as exc:
        print(f"relay status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else render_status(status))
    return 0
