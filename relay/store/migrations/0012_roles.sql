-- NIP-86 roles and per-method grants (relay/store/roles.py): who besides `[admin] pubkeys` may call which
-- management methods.  A pubkey may call the methods granted to it directly (`assignmethod`) and those granted
-- to each of its roles (`assignrole`, and our `assignrolemethod`).

CREATE TABLE roles (
    id          TEXT PRIMARY KEY,  -- the role's id, as NIP-86 createrole names it
    label       TEXT NOT NULL,     -- display name ("" when none)
    description TEXT NOT NULL,     -- what the role is for ("" when none)
    color       TEXT NOT NULL,     -- display color, as the client gave it ("" when none)
    ord         INTEGER NOT NULL   -- NIP-86 `order`: where clients list the role (lowest first)
) WITHOUT ROWID;

CREATE TABLE role_members (
    role   TEXT NOT NULL,  -- roles.id (removed with its role)
    pubkey TEXT NOT NULL,  -- 64-hex pubkey holding the role
    PRIMARY KEY (role, pubkey)
) WITHOUT ROWID;
CREATE INDEX role_members_by_pubkey ON role_members (pubkey);

CREATE TABLE method_grants (
    grantee TEXT NOT NULL,  -- a 64-hex pubkey (assignmethod) or 'role:' || roles.id (assignrolemethod)
    method  TEXT NOT NULL,  -- the NIP-86 method name it may call
    PRIMARY KEY (grantee, method)
) WITHOUT ROWID;
