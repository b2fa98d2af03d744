-- Events, their single-letter tag index, NIP-09 tombstones and NIP-01 coordinate high-water marks.

CREATE TABLE events (
    seq        INTEGER PRIMARY KEY,   -- local insertion order; the tag index points here
    id         BLOB NOT NULL UNIQUE,  -- 32-byte event id
    pubkey     BLOB NOT NULL,         -- 32-byte x-only author key
    created_at INTEGER NOT NULL,      -- unix seconds, author-claimed
    kind       INTEGER NOT NULL,      -- 0..65535
    d_tag      TEXT,                  -- coordinate d value: '' for replaceable, the d tag for addressable, NULL otherwise
    expiration INTEGER,               -- NIP-40 expiry, unix seconds; NULL when none
    origin     TEXT NOT NULL DEFAULT '', -- '' when published here, else the peer it came from
    raw        TEXT NOT NULL          -- the canonical JSON we serve
);
CREATE INDEX events_by_created ON events (created_at DESC, id);
CREATE INDEX events_by_pubkey ON events (pubkey, created_at DESC, id);
CREATE INDEX events_by_kind ON events (kind, created_at DESC, id);
CREATE INDEX events_by_pubkey_kind ON events (pubkey, kind, created_at DESC, id);
CREATE UNIQUE INDEX events_by_coordinate ON events (kind, pubkey, d_tag) WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_expiration ON events (expiration) WHERE expiration IS NOT NULL;

CREATE TABLE tags (
    name       TEXT NOT NULL,     -- single-letter tag name
    value      TEXT NOT NULL,     -- first tag value (position 1)
    created_at INTEGER NOT NULL,  -- copy of events.created_at, so tag filters read in time order
    seq        INTEGER NOT NULL,  -- events.seq
    PRIMARY KEY (name, value, created_at, seq)  -- rows are found and deleted by their full key only
) WITHOUT ROWID;

CREATE TABLE tombstones (
    id          BLOB NOT NULL,  -- id named by a NIP-09 `e` tag
    pubkey      BLOB NOT NULL,  -- the deleter: only this author's event is deleted
    deletion_id BLOB NOT NULL,  -- the kind-5 event that asked
    PRIMARY KEY (id, pubkey)
) WITHOUT ROWID;

CREATE TABLE address_tombstones (
    kind       INTEGER NOT NULL,
    pubkey     BLOB NOT NULL,
    d_tag      TEXT NOT NULL,
    until      INTEGER NOT NULL,  -- versions with created_at <= until are deleted (NIP-09 `a` tag)
    PRIMARY KEY (kind, pubkey, d_tag)
) WITHOUT ROWID;

CREATE TABLE coordinates (
    kind       INTEGER NOT NULL,
    pubkey     BLOB NOT NULL,
    d_tag      TEXT NOT NULL,
    created_at INTEGER NOT NULL,  -- newest version ever accepted (high-water mark), unix seconds
    id         BLOB NOT NULL,     -- its id: ties on created_at keep the lowest id (NIP-01)
    PRIMARY KEY (kind, pubkey, d_tag)
) WITHOUT ROWID;

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
