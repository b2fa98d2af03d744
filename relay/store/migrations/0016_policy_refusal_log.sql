-- The newest refusals by write policies, of every source, for people (the status page); relay/store/refused.py.

CREATE TABLE policy_refusal_log (
    seq      INTEGER PRIMARY KEY,   -- insertion order; the oldest rows are dropped past refused.LOG_ROWS
    event_id TEXT NOT NULL UNIQUE,  -- 64-char hex id of the refused event (not stored); refused again: a new row
    kind     INTEGER NOT NULL,      -- its kind
    source   TEXT NOT NULL,         -- where it came from: "client", "peer" or "import" (relay/ingest/source.py)
    policy   TEXT NOT NULL,         -- the `[[policies]]` entry that refused it
    reason   TEXT NOT NULL,         -- the OK message sent, e.g. "blocked: no links"
    at       INTEGER NOT NULL       -- unix seconds when it was refused
);
