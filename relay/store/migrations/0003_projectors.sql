-- Projectors: the bounded log of events that could not be projected, and the state of causal operation logs.
-- (Projected tables themselves are created by relay/store/projectors from their specs; their spec hash and
-- revision live in `meta` under the key 'projector:<name>'.)

CREATE TABLE IF NOT EXISTS projector_refusals (
    seq       INTEGER PRIMARY KEY,  -- insertion order; the oldest rows are dropped past the configured bound
    projector TEXT NOT NULL,        -- projector (table) name
    event_id  TEXT NOT NULL,        -- 64-char hex id of the event that is stored but not projected
    reason    TEXT NOT NULL,        -- why, e.g. "content is not a JSON object"
    at        INTEGER NOT NULL,     -- unix seconds when it was refused
    UNIQUE (projector, event_id)
);

CREATE TABLE IF NOT EXISTS causal_ops (
    projector TEXT NOT NULL,     -- causal projector name
    log_id    TEXT NOT NULL,     -- the log named by the operation's log tag
    author    TEXT NOT NULL,     -- 64-char hex pubkey: logs are per (log_id, author)
    seq       INTEGER NOT NULL,  -- position in the log, from the sequence tag; 0 is the first operation
    event_id  TEXT NOT NULL,     -- 64-char hex id of the operation's event
    prev      TEXT,              -- back-link: 64-char hex id of the previous operation; NULL at seq 0
    state     TEXT NOT NULL,     -- applied | lost (fork loser) | held (back-link not applied) | waiting (gap)
    PRIMARY KEY (projector, log_id, author, seq, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS causal_ops_by_event ON causal_ops (event_id);
