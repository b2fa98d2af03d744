-- Shards (relay/sync/guard.py): an event handed over is remembered with its shard, so that taking the shard
-- back forgets it (peer sync may then fetch it again).

ALTER TABLE evictions ADD COLUMN shard TEXT;  -- the shard handed over; NULL: removed by a retention rule
CREATE INDEX evictions_by_shard ON evictions (shard) WHERE shard IS NOT NULL;
