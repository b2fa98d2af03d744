-- The change feed of projected rows (relay/store/projectors/rowfeed.py, `relay changes --table`): each row of a
-- table named in `[store] row_change_tables` inserted, replaced or removed, by position, written in the same
-- transaction as the projection.  Bounded like the event feed's removals (`store.change_log_max_entries`).

CREATE TABLE row_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- the change's position: grows in commit order, never reused
    tbl TEXT NOT NULL,                      -- the projected table
    op  TEXT NOT NULL,                      -- insert | replace | remove
    key TEXT NOT NULL,                      -- JSON object: the row's primary key columns and values
    row TEXT                                -- JSON object: every column of the row put; NULL for a remove
);
CREATE INDEX row_changes_by_table ON row_changes (tbl, seq);

CREATE TABLE row_feed_tables (
    tbl    TEXT PRIMARY KEY,  -- a table whose row changes are logged
    oldest INTEGER NOT NULL   -- the oldest cursor accepted for it: changes up to it were dropped (the log's
                              -- bound), or the table was emptied there to be built again
);
