-- Peer sync: events a peer refused for good (NIP-01 invalid:, blocked:, pow:, restricted:, mute:) are settled,
-- not errors that fail every run; how many the last reconciliation met shows in `relay status` and metrics.

ALTER TABLE sync_peers ADD COLUMN refused INTEGER NOT NULL DEFAULT 0;  -- in the last complete reconciliation
