"""`relay status`: database size, events by kind, projectors, and each sync peer's state, read-only.

The state is `relay.status.gather_status` (read-only, WAL: a running relay
is not disturbed), so it works whether or not `relay serve` is running.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from contextlib import closing

from relay.commands import SERVED_DATABASE_HINT, open_readonly
from relay.config import Config
from relay.status import duration, status_of
from relay.store.location import require_database


def _when(seconds: float | None, now: float) -> str:
    if seconds is None:
        return "never"
    ago = now - seconds
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    if ago >= 0:
        return f"{stamp} ({duration(ago)} ago)"
    return f"{stamp} (in {duration(-ago)})"


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _processes(processes: dict | None, now: float) -> list[str]:
    """The lines of the running relay's processes (none when it runs none: not running, or one process)."""
    if processes is None:
        return []
    writer = processes["writer"]
    lines = [f"processes: writer pid {writer['pid']}, started {_when(writer['started'], now)}; "
             f"{len(processes['workers'])} workers"]
    for w in processes["workers"]:
        lines.append(f"  worker {w['index']}: pid {w['pid']}, started {_when(w['started'], now)}, "
                     f"restarts {w['restarts']}")
    return lines


def _claim(claim: dict, now: float) -> str:
    since = _when(claim["since"], now) if claim["since"] else "the first"
    until = _when(claim["until"], now) if claim["until"] else "not yet"
    return f"{claim['status']}, events created since {since}, complete up to {until}; claimed " \
           f"{duration(claim['age_seconds'])} ago"


def _shards(shards: list[dict], now: float) -> list[str]:
    """The lines of the declared shards: this node's claim, the other fleet nodes', the copies they claim."""
    lines = [f"shards: {len(shards)}"] if shards else []
    for s in shards:
        held = "held" if s["hold"] else "leaving: hold = false"
        lines.append(f"  {s['id']} ({held}, filter {json.dumps(s['filter'])})")
        lines.append(f"    this node: {_claim(s['claim'], now) if s['claim'] else 'no claim yet'}")
        for h in s["holders"]:
            via = "" if h["shard"] == s["id"] else f" (its shard {h['shard']!r} covers this one)"
            lines.append(f"    {h['pubkey'][:16]}... {h['url']}{via}: {_claim(h, now)}")
        under = ", UNDER-REPLICATED: retention and handover of this shard wait" if s["under_replicated"] else ""
        lines.append(f"    copies claimed by other nodes: {s['claimed_copies']}{under}; events held back by the "
                     f"guard: {s['held_back']}")
        if s["copied_key"]:
            lines.append(f"    COPIED NODE KEY: a claim of this node's key names database instance "
                         f"{s['copied_key']}; this shard is not claimed until one of them has its own key")
    return lines


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
        if p.get("refused"):
            lines.append(f"    refused {p['refused']}: events the peer refused for good in the last reconciliation "
                         "(settled; relay sync and the sync_reconciled log line name them)")
        if p.get("last_error"):
            lines.append(f"    last error {_when(p.get('last_error_at'), now)}: {p['last_error']}")
        if p.get("lease_owner") and (p.get("lease_expires") or 0) > now:
            lines.append(f"    syncing now: {p['lease_owner']} (lease until {_when(p['lease_expires'], now)})")
    lines.extend(_processes(status.get("processes"), now))
    for f in status.get("failing", []):
        lines.append(f"FAILING: {f['step']}: {f['attempts']} attempts since {_when(f['since'], now)}, next "
                     f"{_when(f['retry_at'], now)}; last error: {f['error']}")
    lines.extend(_shards(status.get("shards", ()), now))
    if status.get("foreign_held_back"):
        lines.append(f"  events of no shard held here, held back by the guard: {status['foreign_held_back']} (they "
                     f"leave once min_copies other nodes return them)")
    lines.append(f"projectors: {len(status['projectors'])}" + ("" if status["projectors"] else " (none configured)"))
    for p in status["projectors"]:
        lines.append(f"  {p['name']} (kind {p['kind']}, revision {p['revision']}): {p['state']}, {p['rows']} rows, "
                     f"{p['refusals']} refusals")
    return "\n".join(lines)


def run_status(config: Config, as_json: bool) -> int:
    """`relay status [--json]`: print the status; exit 2 (one line) when the file is not a relay database, 1 when
    it cannot be read now.

    Raises:
        DatabaseUnusable: there is no database at `store.path` (exit 2, as every command that reads one).
    """
    require_database(config.store.path, SERVED_DATABASE_HINT)
    conn = open_readonly(config.store.path, "status")  # a file that is not a relay database: exit 2, as elsewhere
    if conn is None:
        return 2
    try:
        with closing(conn):
            status = status_of(conn, config)
    except sqlite3.Error as exc:
        print(f"relay status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else render_status(status))
    return 0
