-- Peer sync (relay/sync/): one row per peer, shared by every relay process on this database.

CREATE TABLE sync_peers (
    url           TEXT PRIMARY KEY,            -- the peer's WebSocket URL; also the `origin` of the events it sent
    last_attempt  INTEGER,                     -- unix seconds when the last connection attempt started; NULL: never
    last_success  INTEGER,                     -- unix seconds when the last reconciliation finished; NULL: never
    events_in     INTEGER NOT NULL DEFAULT 0,  -- events stored here that came from this peer, all time
    events_out    INTEGER NOT NULL DEFAULT 0,  -- events this peer accepted from us (OK true, not duplicate), all time
    last_error    TEXT,                        -- why the last failed attempt failed; kept after later successes
    last_error_at INTEGER,                     -- unix seconds of last_error
    lease_owner   TEXT,                        -- the process syncing this peer now ("host:pid:random"); NULL: nobody
    lease_expires REAL                         -- unix seconds (fractional); after it the lease is free to take
) WITHOUT ROWID;
