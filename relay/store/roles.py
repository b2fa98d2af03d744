"""NIP-86 roles and per-method grants in the database: who besides `[admin] pubkeys` may call which methods.

How this works: a role (`roles`) is held by pubkeys (`role_members`); a
method is granted (`method_grants`) either to a pubkey or to a role (grantee
`role:<id>`).  A pubkey may call the methods granted to it and to each of
its roles (`methods_of`).  Nothing is cached: the management API reads the
grants of a non-admin caller at each request, so a change applies to the
next request.  A change is one `run` job on the writer (a step below in one
transaction); reads are `Store.read_snapshot` jobs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from relay.store.db import transaction
from relay.store.writes import Changes, TransactionHook

ROLE_PREFIX = "role:"
"""`method_grants.grantee` of a role's grant: this, then the role's id (a pubkey is 64 hex, never this)."""


@dataclass(frozen=True, slots=True)
class Role:
    """One NIP-86 role: `id`, display `label`, `description`, `color` ("" when none), `order` (clients list
    the lowest first)."""

    id: str
    label: str = ""
    description: str = ""
    color: str = ""
    order: int = 0


def role_grantee(role_id: str) -> str:
    """The `method_grants.grantee` of the role `role_id`."""
    return ROLE_PREFIX + role_id


def run(conn: sqlite3.Connection, hooks: Sequence[TransactionHook], step: Callable, *args) -> tuple[Changes, object]:
    """`Store.run_job` job: `step(cursor, *args)` (one of the steps below) in one transaction; its result."""
    with transaction(conn) as cur:
        return Changes(), step(cur, *args)


# --- steps (writer, in `run`'s transaction) ------------------------------------------------------------


def create_role(cur: sqlite3.Cursor, role: Role) -> bool:
    """Add `role`; False (nothing changed) when its id exists."""
    return cur.execute("INSERT OR IGNORE INTO roles (id, label, description, color, ord) VALUES (?, ?, ?, ?, ?)",
                       (role.id, role.label, role.description, role.color, role.order)).rowcount > 0


def edit_role(cur: sqlite3.Cursor, role_id: str, label: str | None, description: str | None, color: str | None,
              order: int | None) -> bool:
    """Set the fields of the role `role_id` that are not None, keeping the others; False when there is none."""
    return cur.execute("UPDATE roles SET label = coalesce(?, label), description = coalesce(?, description), "
                       "color = coalesce(?, color), ord = coalesce(?, ord) WHERE id = ?",
                       (label, description, color, order, role_id)).rowcount > 0


def delete_role(cur: sqlite3.Cursor, role_id: str) -> bool:
    """Remove the role `role_id` with its members and its grants; False when there was none."""
    cur.execute("DELETE FROM role_members WHERE role = ?", (role_id,))
    cur.execute("DELETE FROM method_grants WHERE grantee = ?", (role_grantee(role_id),))
    return cur.execute("DELETE FROM roles WHERE id = ?", (role_id,)).rowcount > 0


def assign_role(cur: sqlite3.Cursor, pubkey: str, role_id: str) -> bool:
    """Give 64-hex `pubkey` the role `role_id`; False when there is no such role."""
    if cur.execute("SELECT 1 FROM roles WHERE id = ?", (role_id,)).fetchone() is None:
        return False
    cur.execute("INSERT OR IGNORE INTO role_members (role, pubkey) VALUES (?, ?)", (role_id, pubkey))
    return True


def unassign_role(cur: sqlite3.Cursor, pubkey: str, role_id: str) -> bool:
    """Take the role `role_id` from `pubkey`; False when it did not hold it."""
    return cur.execute("DELETE FROM role_members WHERE role = ? AND pubkey = ?", (role_id, pubkey)).rowcount > 0


def grant(cur: sqlite3.Cursor, grantee: str, method: str) -> bool | None:
    """Let `grantee` (a pubkey, or `role_grantee(id)`) call `method`: True when newly granted, False when it
    was already, None when the grantee is a role that does not exist."""
    if grantee.startswith(ROLE_PREFIX) and cur.execute(
            "SELECT 1 FROM roles WHERE id = ?", (grantee.removeprefix(ROLE_PREFIX),)).fetchone() is None:
        return None
    return cur.execute("INSERT OR IGNORE INTO method_grants (grantee, method) VALUES (?, ?)",
                       (grantee, method)).rowcount > 0


def revoke(cur: sqlite3.Cursor, grantee: str, method: str) -> bool:
    """Stop `grantee` calling `method` (through this grant); False when it was not granted."""
    return cur.execute("DELETE FROM method_grants WHERE grantee = ? AND method = ?", (grantee, method)).rowcount > 0


# --- reads (`Store.read_snapshot` jobs; read connections hand TEXT over as bytes) ----------------------


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def methods_of(conn: sqlite3.Connection, pubkey: str) -> frozenset[str]:
    """The methods 64-hex `pubkey` may call: granted to it, or to a role it holds."""
    return frozenset(_text(m) for (m,) in conn.execute(
        "SELECT method FROM method_grants WHERE grantee = ?"
        " UNION SELECT method FROM method_grants WHERE grantee IN"
        " (SELECT ? || role FROM role_members WHERE pubkey = ?)", (pubkey, ROLE_PREFIX, pubkey)))


def assignees(conn: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """(pubkey, the methods it may call, sorted) of every pubkey granted a method itself or through a role,
    by pubkey."""
    rows = conn.execute(
        "SELECT grantee, method FROM method_grants WHERE grantee NOT LIKE 'role:%'"
        " UNION SELECT m.pubkey, g.method FROM role_members m JOIN method_grants g ON g.grantee = ? || m.role"
        " ORDER BY 1, 2", (ROLE_PREFIX,))
    found: dict[str, list[str]] = {}
    for pubkey, method in rows:
        found.setdefault(_text(pubkey), []).append(_text(method))
    return list(found.items())


def roles(conn: sqlite3.Connection) -> list[tuple[Role, list[str], list[str]]]:
    """(role, its methods, its pubkeys), both sorted, of every role, in NIP-86 order (then by id)."""
    def column(sql: str, key: str) -> list[str]:
        return [_text(v) for (v,) in conn.execute(sql, (key,))]

    found = []
    for id_, label, description, color, order in conn.execute(
            "SELECT id, label, description, color, ord FROM roles ORDER BY ord, id"):
        role = Role(_text(id_), _text(label), _text(description), _text(color), order)
        found.append((role, column("SELECT method FROM method_grants WHERE grantee = ? ORDER BY 1",
                                   role_grantee(role.id)),
                      column("SELECT pubkey FROM role_members WHERE role = ? ORDER BY 1", role.id)))
    return found
