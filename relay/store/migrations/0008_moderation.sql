-- Moderation (NIP-86, `relay ban`): relay/store/moderation.py.

CREATE TABLE moderation (
    list   TEXT NOT NULL,     -- which list: banned_pubkey, allowed_pubkey, trusted_pubkey, banned_event,
                              -- allowed_event, allowed_kind, disallowed_kind, blocked_ip, info, purge_pubkey
    item   TEXT NOT NULL,     -- 64-hex pubkey or event id, a kind in decimal, an IP address or network,
                              -- or the [info] field (name, description, icon) NIP-86 overrides
    reason TEXT NOT NULL,     -- the operator's reason ("" when none); for info: the value
    at     INTEGER NOT NULL,  -- when it was set, unix seconds
    PRIMARY KEY (list, item)
) WITHOUT ROWID;
-- A banned_event row refuses the event from every source (blocked:), and peer sync neither fetches it
-- nor stores it; a purge_pubkey row is a pubkey whose stored events are still being removed in batches.

INSERT INTO meta (key, value) VALUES ('moderation_version', '0');
-- Raised by every change, so that a running relay sees a change made by `relay ban` in another process.
