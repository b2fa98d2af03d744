-- Retention (relay/store/retention.py) and NIP-62 requests to vanish (relay/store/vanish.py).

CREATE TABLE evictions (
    id         BLOB PRIMARY KEY,  -- 32-byte id of an event removed by a retention rule
    created_at INTEGER NOT NULL,  -- its created_at, unix seconds
    evicted_at INTEGER NOT NULL   -- when it was removed, unix seconds
) WITHOUT ROWID;  -- read only by peer sync: an evicted event is never fetched back from a peer

CREATE TABLE vanished (
    pubkey     BLOB PRIMARY KEY,  -- 32-byte author who asked to vanish (NIP-62)
    until      INTEGER NOT NULL,  -- newest created_at of its honoured requests: its events up to it, and gift
                                  -- wraps p-tagging it up to it, are deleted and refused with blocked:
    request_id BLOB NOT NULL      -- the kind-62 event that set `until`
) WITHOUT ROWID;
