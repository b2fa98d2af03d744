"""NIP-86 roles and per-method grants: the methods that manage them, and what a caller may call.

How this works: `[admin] pubkeys` may call every method.  Any other pubkey
may call exactly the methods granted to it (`assignmethod`) or to a role it
holds (`assignrole`; a role's methods: our `assignrolemethod`), read from the
database at each request (relay/store/roles.py), and `supportedmethods`,
which then lists those.  Only the moderation methods (`grantable`) can be
granted: the ones below, which hand out permissions, stay with the admins.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from relay.ingest.moderation import Moderation
from relay.server.rpc import Method, MethodError, param, pubkey
from relay.store import roles as table
from relay.store.roles import Role

MAX_ROLE_ID = 64
"""Characters a role id (or a method name) may have at most."""
MAX_ROLE_TEXT = 4096
"""Characters a role's label, description or color may have at most."""


def _is_text(limit: int) -> Callable[[object], bool]:
    return lambda v: type(v) is str and len(v) <= limit


def _role_id(params: list, i: int) -> str:
    return param(params, i, f"a role id (1 to {MAX_ROLE_ID} characters)",
                 lambda v: type(v) is str and 0 < len(v) <= MAX_ROLE_ID)


def _role(params: list) -> Role:
    """NIP-86 createrole / editrole params: [id, label, description, color, order]; all but id may be left out."""
    text = [param(params, i, f"a string of at most {MAX_ROLE_TEXT} characters", _is_text(MAX_ROLE_TEXT), "")
            for i in (1, 2, 3)]
    order = param(params, 4, "an integer (the order)", lambda v: type(v) is int and abs(v) < 2**63, 0)
    return Role(_role_id(params, 0), *text, order)


async def _write(moderation: Moderation, step: Callable, *args) -> object:
    return await moderation.writer.run_job(table.run, step, *args)


def _must(done: object, error: str) -> bool:
    if not done:
        raise MethodError(error)
    return True


async def _create_role(moderation: Moderation, params: list) -> bool:
    role = _role(params)
    return _must(await _write(moderation, table.create_role, role), f"invalid: role {role.id!r} exists")


async def _edit_role(moderation: Moderation, params: list) -> bool:
    # a field left out or null keeps its value, so that an edit may change the color alone
    kept = {i for i in (1, 2, 3, 4) if i >= len(params) or params[i] is None}
    role = _role([("" if i < 4 else 0) if i in kept else v for i, v in enumerate(params)])  # kept ones: placeholders
    fields = [None if i in kept else v for i, v in enumerate((role.label, role.description, role.color, role.order), 1)]
    return _must(await _write(moderation, table.edit_role, role.id, *fields), f"invalid: no role {role.id!r}")


async def _delete_role(moderation: Moderation, params: list) -> bool:
    await _write(moderation, table.delete_role, _role_id(params, 0))  # (none: already as asked)
    return True


async def _assign_role(moderation: Moderation, params: list) -> bool:
    role_id = _role_id(params, 1)
    return _must(await _write(moderation, table.assign_role, pubkey(params), role_id), f"invalid: no role {role_id!r}")


async def _unassign_role(moderation: Moderation, params: list) -> bool:
    await _write(moderation, table.unassign_role, pubkey(params), _role_id(params, 1))
    return True


def _granting(grantable: Collection[str], grantee: Callable[[list], str], give: bool) -> Method:
    """assignmethod / unassignmethod (grantee: a pubkey) and ours for roles: result [true|false, message]."""
    async def change(moderation: Moderation, params: list) -> list:
        who = grantee(params)
        method = param(params, 1, "a method name", lambda v: type(v) is str and len(v) <= MAX_ROLE_ID)
        if method not in grantable and method not in ADMIN_ONLY:
            raise MethodError(f"invalid: no method {method!r:.80}")
        if give and method in ADMIN_ONLY:
            return [False, f"restricted: {method} stays with the relay's admins"]
        done = await _write(moderation, table.grant if give else table.revoke, who, method)
        if done is None:
            raise MethodError(f"invalid: no role {params[0]!r}")
        verb = "granted" if give else "revoked"
        return [True, f"{method} {verb}"] if done else [False, f"{method} was {'already' if give else 'not'} granted"]
    return change


def _role_grantee(params: list) -> str:
    return table.role_grantee(_role_id(params, 0))


async def _assignees(moderation: Moderation, params: list) -> list[dict]:
    return [{"pubkey": p, "methods": methods} for p, methods in await moderation.store.read_snapshot(table.assignees)]


async def _roles(moderation: Moderation, params: list) -> list[dict]:
    return [{"id": role.id, "label": role.label, "description": role.description, "color": role.color,
             "order": role.order, "methods": methods, "pubkeys": pubkeys}
            for role, methods, pubkeys in await moderation.store.read_snapshot(table.roles)]


ADMIN_ONLY = frozenset({"createrole", "editrole", "deleterole", "assignrole", "unassignrole", "assignmethod",
                        "unassignmethod", "listmethodassignees", "listroles", "assignrolemethod",
                        "unassignrolemethod"})
"""The methods of this module: never granted, so that only admins hand out permissions."""


def methods(grantable: Collection[str]) -> dict[str, Method]:
    """NIP-86's role and grant methods, and ours (`listroles`; `assignrolemethod` / `unassignrolemethod`:
    [role id, method] -> [true|false, message], a role's grants), by name; `grantable`: the method names
    that may be granted."""
    return {
        "createrole": _create_role,
        "editrole": _edit_role,
        "deleterole": _delete_role,
        "assignrole": _assign_role,
        "unassignrole": _unassign_role,
        "assignmethod": _granting(grantable, pubkey, give=True),
        "unassignmethod": _granting(grantable, pubkey, give=False),
        "listmethodassignees": _assignees,
        # ours: roles carry grants, and a client can list them
        "listroles": _roles,
        "assignrolemethod": _granting(grantable, _role_grantee, give=True),
        "unassignrolemethod": _granting(grantable, _role_grantee, give=False),
    }


async def permitted(moderation: Moderation, caller: str) -> frozenset[str]:
    """The methods 64-hex `caller`, not an admin, may call (granted to it or its roles), read now."""
    return await moderation.store.read_snapshot(table.methods_of, caller)
