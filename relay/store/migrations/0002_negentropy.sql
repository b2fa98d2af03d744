-- NIP-77 negentropy index (relay/store/negentropy/): the (created_at, id) of every event, and of the
-- events of each filter listed under [negentropy] filters, with per-node sums so that a range fingerprint
-- reads a few summary rows instead of every item.  Which filters are indexed is decided at start-up by the
-- hook's setup (rows of filters no longer configured are deleted, new ones are built from `events`).

CREATE TABLE neg_filters (
    filter_no INTEGER PRIMARY KEY,  -- small local number of an indexed filter
    spec      TEXT NOT NULL UNIQUE  -- the filter as canonical JSON, without since/until/limit ('{}': every event)
);

CREATE TABLE neg_items (
    filter_no  INTEGER NOT NULL,  -- neg_filters.filter_no
    created_at INTEGER NOT NULL,  -- the event's created_at, unix seconds
    id         BLOB NOT NULL,     -- the event's 32-byte id
    PRIMARY KEY (filter_no, created_at, id)
) WITHOUT ROWID;

-- Summary nodes, a two-level B+-tree in rows: a level-1 node (bucket) covers the items from its start key up to
-- the next level-1 start key of the same filter; a level-2 node (group) covers the buckets from its start key up
-- to the next level-2 start key.  Every group starts where one of its buckets starts; the first bucket and the
-- first group of each filter start at the sentinel key (-1, X'') below every event.
CREATE TABLE neg_nodes (
    filter_no  INTEGER NOT NULL,  -- neg_filters.filter_no
    level      INTEGER NOT NULL,  -- 1: bucket of items, 2: group of buckets
    created_at INTEGER NOT NULL,  -- start key, part 1: unix seconds (-1 for the sentinel)
    id         BLOB NOT NULL,     -- start key, part 2: 32-byte id (X'' for the sentinel)
    count      INTEGER NOT NULL,  -- items covered
    children   INTEGER NOT NULL,  -- items (level 1) or buckets (level 2) directly below
    -- Sums over the covered ids of their 32-bit little-endian limbs (limb j = bytes 4j..4j+3), each without
    -- carry: exact in 64 bits below 2**31 items; carries are folded when a fingerprint is computed.
    s0 INTEGER NOT NULL, s1 INTEGER NOT NULL, s2 INTEGER NOT NULL, s3 INTEGER NOT NULL,
    s4 INTEGER NOT NULL, s5 INTEGER NOT NULL, s6 INTEGER NOT NULL, s7 INTEGER NOT NULL,
    PRIMARY KEY (filter_no, level, created_at, id)
) WITHOUT ROWID;
