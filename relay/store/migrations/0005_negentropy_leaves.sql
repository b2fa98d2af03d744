-- NIP-77 negentropy index, layout 2 (relay/store/negentropy/): a bucket's items are packed into its own
-- row instead of one `neg_items` row per item, so a reader decodes a bucket from one row, and each group carries
-- a stamp that changes with any change below it, so readers can keep decoded groups between messages.
-- The index is rebuilt from `events` at the next start (its layout version in `meta` changes).

DROP TABLE neg_items;
ALTER TABLE neg_nodes ADD COLUMN stamp INTEGER NOT NULL DEFAULT 0;  -- level 2: random, new at every change below
ALTER TABLE neg_nodes ADD COLUMN ts BLOB;   -- level 1: the items' created_at, little-endian uint64 each, sorted
ALTER TABLE neg_nodes ADD COLUMN ids BLOB;  -- level 1: the items' 32-byte ids, in the same order
