-- Write policies (relay/ingest/policies.py): the peers' events a policy refused (relay/store/refused.py).

CREATE TABLE policy_refusals (
    id         BLOB PRIMARY KEY,  -- 32-byte id of an event from a peer that a write policy refused here
    origin     TEXT NOT NULL,     -- the peer's URL
    refused_at INTEGER NOT NULL   -- when it was refused, unix seconds
) WITHOUT ROWID;  -- read only by peer sync: such an id is settled, never fetched again; oldest dropped past a bound

CREATE INDEX policy_refusals_by_time ON policy_refusals (refused_at);
