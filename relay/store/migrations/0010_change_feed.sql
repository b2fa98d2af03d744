-- The change feed (relay/store/feed.py): every committed insertion and removal of an event has a position in one
-- integer sequence, in commit order.  An insertion's position is the `events.seq` it was given; a removal's is
-- a row of `removals`, a log bounded by `max_entries` (oldest dropped first).  A removal row keeps the position
-- of the insertion it undoes, so an event inserted and later removed still shows both.

CREATE TABLE removals (
    seq        INTEGER PRIMARY KEY,  -- the removal's position in the feed
    insert_seq INTEGER NOT NULL,     -- the position of the insertion it undoes (the events.seq the row had)
    id         BLOB NOT NULL,        -- 32-byte event id
    pubkey     BLOB NOT NULL,        -- 32-byte author key
    created_at INTEGER NOT NULL,     -- the event's created_at, unix seconds
    kind       INTEGER NOT NULL,     -- the event's kind
    reason     TEXT NOT NULL         -- superseded | deleted | vanished | expired | retention | banned
);
CREATE INDEX removals_by_insert ON removals (insert_seq);

CREATE TABLE feed_state (
    one             INTEGER PRIMARY KEY CHECK (one = 1),  -- a single row
    trimmed_through INTEGER NOT NULL DEFAULT 0,  -- highest position of a removal dropped from the log: a cursor
                                                 -- below it may miss changes (stale)
    entries         INTEGER NOT NULL DEFAULT 0,  -- rows in `removals`
    max_entries     INTEGER NOT NULL DEFAULT 1000000  -- the bound, set from store.change_log_max_entries at each open
);
INSERT INTO feed_state (one) VALUES (1);

-- Peer sync's live push (relay/sync/scheduler.py) resumes from here after an outage or a restart.
ALTER TABLE sync_peers ADD COLUMN push_cursor INTEGER;  -- change feed position pushed up to (every event
                                                        -- committed up to it was answered by the peer); NULL: never
