"""`relay ban event|pubkey|ip`, `relay unban event|pubkey|ip`, `relay bans [--json]`: the moderation lists from
the command line.

Each command opens the store as `relay serve` does (relay/assembly.py
`open_store`, with its transaction hooks), or writes through the writer of
the relay serving it (relay/commands/through.py), and changes the lists
through the same `Moderation` the NIP-86 API uses (relay/ingest/moderation.py),
so a banned event leaves with its tag rows, projected rows and negentropy
entries, and `relay verify` stays clean.  A relay serving the same database
reads the change at once when it has worker processes (the change went
through its writer), else within `[admin] refresh_seconds`.  Bans are per database:
on a mesh, ban on each node.
"""

from __future__ import annotations

import ipaddress
import json
import sys

from relay.commands import utc_time
from relay.commands.through import WritePath, open_write_path
from relay.config import Config
from relay.ingest.moderation import Moderation, Refused, admin_ban_refusal
from relay.protocol.event import is_hex64
from relay.server.management import MAX_REASON, block_refusal
from relay.store.db import require_relay_database
from relay.store.moderation import (
    ALLOWED_KIND,
    BANNED_EVENT,
    BANNED_PUBKEY,
    BLOCKED_IP,
    DISALLOWED_KIND,
    PURGE_PUBKEY,
)

_LISTS = {"pubkey": (BANNED_PUBKEY, PURGE_PUBKEY), "event": (BANNED_EVENT,), "ip": (BLOCKED_IP,)}
"""What `relay unban WHAT X` takes X off; a pubkey's unfinished purge stops with its ban."""


def _valid(what: str, item: str) -> str | None:
    """`item` as stored for `what` (event, pubkey: 64 lowercase hex; ip: an address or network), else None."""
    if what != "ip":
        return item if is_hex64(item) else None
    try:
        return str(ipaddress.ip_network(item, strict=False))
    except ValueError:
        return None


async def _open(config: Config) -> tuple[Moderation, WritePath]:
    """The moderation lists of the existing database at `store.path`, and where changes to them are written
    (through the running relay's writer when one serves it: every process then reads them at once)

    Raises:
        DatabaseUnusable: there is no file there: a mistyped `--db` would otherwise create a new database
            that no running relay reads, and the ban would report success yet apply nowhere.
    """
    require_relay_database(config.store.path, "check --db")
    path = await open_write_path(config, read_connections=1)
    return await Moderation.open(path.store, config, writer=path.writer), path


async def run_ban(config: Config, what: str, item: str, reason: str, purge: bool) -> int:
    """`relay ban event ID | pubkey PK [--purge] | ip ADDRESS`: exit 0; 2 (message on stderr) for a malformed ID,
    PK or ADDRESS, a PK of `[admin] pubkeys`, a network wider than `WIDEST_BLOCK`, or a `reason` longer than
    `MAX_REASON` characters (relay/server/management.py).

    An event is removed at once if stored; a pubkey's stored events are
    removed too with `--purge` or `[admin] purge_on_ban`, in batches (run
    again to resume a purge cut short).  A blocked IP (an address or a
    network, e.g. 192.0.2.0/24) has its new connections closed (1008) by a
    relay serving the database; connections already open stay.
    """
    key = _valid(what, item)
    if key is None:
        print(f"relay ban: not a valid {what}: {item!r}" + (" (64 lowercase hex characters)" if what != "ip" else ""),
              file=sys.stderr)
        return 2
    refusal = (f"--reason is longer than {MAX_REASON} characters" if len(reason) > MAX_REASON
               else admin_ban_refusal(key) if what == "pubkey" and key in config.admin.pubkeys
               else block_refusal(key, admin=True) if what == "ip" else None)
    if refusal is not None:  # as NIP-86 refuses it
        print(f"relay ban: {refusal}", file=sys.stderr)
        return 2
    moderation, path = await _open(config)
    try:
        if what == "ip":
            await moderation.add(BLOCKED_IP, key, reason)
            print(f"relay ban: ip {key} blocked")
            return 0
        if what == "event":
            removed = await moderation.ban_event(item, reason)
            print(f"relay ban: event {item} banned; {'removed' if removed else 'was not stored'}")
            return 0
        purge = purge or config.admin.purge_on_ban
        try:
            await moderation.ban_pubkey(item, reason, purge)
        except Refused as exc:  # by the serving relay's writer: its [admin] pubkeys, not this command's config
            print(f"relay ban: {exc}", file=sys.stderr)
            return 2
        if purge and path.channel is not None:  # the serving relay's writer purges it, as for NIP-86's banpubkey
            print(f"relay ban: pubkey {item} banned; the relay serving the database removes its stored events "
                  "(`relay bans` says purging until it is done)")
            return 0
        removed = await moderation.purge(item) if purge else 0
        print(f"relay ban: pubkey {item} banned" + (f"; {removed} stored events removed" if purge else ""))
        return 0
    finally:
        await path.close()


async def run_unban(config: Config, what: str, item: str) -> int:
    """`relay unban event|pubkey|ip X`: exit 0 when X was banned (blocked), 1 when it was not, 2 when malformed.

    An unbanned event or pubkey may be published again; what a ban removed stays removed.
    """
    key = _valid(what, item)
    if key is None:
        print(f"relay unban: not a valid {what}: {item!r}", file=sys.stderr)
        return 2
    moderation, path = await _open(config)
    try:
        gone = await moderation.remove(_LISTS[what], key)
    finally:
        await path.close()
    if not gone:
        print(f"relay unban: {what} {key} was not banned", file=sys.stderr)
        return 1
    print(f"relay unban: {what} {key} unbanned")
    return 0


async def run_bans(config: Config, as_json: bool) -> int:
    """`relay bans [--json]`: banned pubkeys (with unfinished purges), banned events, blocked IPs, and the kind
    rules: the configuration's (`[auth] allow_kinds`, `deny_kinds`; reason "config: ...", `at` 0), then the
    database's (NIP-86 `allowkind`, `disallowkind`).

    JSON shape: `{"pubkeys": [{"pubkey", "reason", "at", "purging"}], "events": [{"id", "reason", "at"}],
    "ips": [{"ip", "reason", "at"}], "kinds": [{"kind": int, "rule": "allow" | "deny", "reason", "at"}]}`,
    `at` in unix seconds.  Else tab-separated, for people: the header `what item rule reason at purging`,
    then a line each: rule `ban`, `block`, `allow` or `deny`; `at` in ISO 8601 UTC ("" for the
    configuration's rules); purging `yes` or `no` for a pubkey ("" for others).
    """
    moderation, path = await _open(config)
    await path.close()
    purging = {e.item for e in moderation.entries(PURGE_PUBKEY)}
    found = {
        "pubkeys": [{"pubkey": e.item, "reason": e.reason, "at": e.at, "purging": e.item in purging}
                    for e in moderation.entries(BANNED_PUBKEY)],
        "events": [{"id": e.item, "reason": e.reason, "at": e.at} for e in moderation.entries(BANNED_EVENT)],
        "ips": [{"ip": e.item, "reason": e.reason, "at": e.at} for e in moderation.entries(BLOCKED_IP)],
        "kinds": [{"kind": kind, "rule": rule, "reason": f"config: [auth] {key}", "at": 0}
                  for rule, key, kinds in (("allow", "allow_kinds", config.auth.allow_kinds),
                                           ("deny", "deny_kinds", config.auth.deny_kinds)) for kind in sorted(kinds)]
                 + [{"kind": int(e.item), "rule": rule, "reason": e.reason, "at": e.at}
                    for rule, name in (("allow", ALLOWED_KIND), ("deny", DISALLOWED_KIND))
                    for e in moderation.entries(name)],
    }
    if as_json:
        print(json.dumps(found, ensure_ascii=False))
        return 0
    print("\t".join(_COLUMNS))
    for what, rows in found.items():
        for row in rows:
            item = next(iter(row.values()))  # each list's first field: pubkey, id, ip or kind
            print("\t".join([what[:-1], str(item),
                             row.get("rule") or _RULES[what], row["reason"], utc_time(row["at"]),
                             {True: "yes", False: "no"}.get(row.get("purging"), "")]))
    return 0


_COLUMNS = ("what", "item", "rule", "reason", "at", "purging")
_RULES = {"pubkeys": "ban", "events": "ban", "ips": "block"}


