-- A NIP-98 auth event is used up by its signature, not its id (relay/store/auth_claims.py): the id covers
-- created_at, tags and content only, so two identical calls signed within one second share it, while a replay
-- copies the signature too (BIP-340 signatures cannot be altered without the key). Claims whose window was
-- still open are dropped with the old table: at most admin.auth_max_age_seconds of them.

DROP TABLE nip98_used;

CREATE TABLE nip98_used (
    sig   BLOB PRIMARY KEY,   -- 64-byte BIP-340 signature of the auth event (kind 27235)
    until INTEGER NOT NULL    -- unix seconds: the end of its window (created_at + admin.auth_max_age_seconds)
) WITHOUT ROWID;
