-- Convergence of syncing nodes (DESIGN.md, invariant 5; relay/store/evidence.py).

-- The high-water mark's expiry: an expired version leaves no mark (the NIP-40 purge removes it).
ALTER TABLE coordinates ADD COLUMN expiration INTEGER;  -- NIP-40 expiry of the mark's version, unix seconds
-- The mark's version as JSON when it was deleted by an `e` tag: sent to a peer that offers an older version.
ALTER TABLE coordinates ADD COLUMN deleted_raw TEXT;
UPDATE coordinates SET expiration = (SELECT e.expiration FROM events e WHERE e.id = coordinates.id);
CREATE INDEX coordinates_by_expiration ON coordinates (expiration) WHERE expiration IS NOT NULL;

-- Ids that reconciliation with this peer found different in two runs in a row: a difference sync does not close.
ALTER TABLE sync_peers ADD COLUMN lasting_differences INTEGER NOT NULL DEFAULT 0;
