-- Records (relay/store/clock.py): the last created_at reserved per coordinate for an event the node signs from
-- a row, so two processes never sign one value and the order holds across restarts.

CREATE TABLE record_clock (
    kind       INTEGER NOT NULL,  -- replaceable or addressable kind
    pubkey     BLOB NOT NULL,     -- 32-byte signer key
    d_tag      TEXT NOT NULL,     -- '' for replaceable kinds, the d tag for addressable ones
    last       INTEGER NOT NULL,  -- the greatest created_at reserved here, unix seconds
    PRIMARY KEY (kind, pubkey, d_tag)
) WITHOUT ROWID;
