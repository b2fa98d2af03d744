-- NIP-98 auth events already used by a NIP-86 call (relay/store/auth_claims.py): no replay within an event's
-- time window, whichever process of the relay (server.workers) answers the call, and across restarts.

CREATE TABLE nip98_used (
    id    BLOB PRIMARY KEY,   -- 32-byte id of the auth event (kind 27235)
    until INTEGER NOT NULL    -- unix seconds: the end of its window (created_at + admin.auth_max_age_seconds)
) WITHOUT ROWID;
