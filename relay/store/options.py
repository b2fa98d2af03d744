"""The store's options (`StoreOptions`): counts of events and connections, bytes, seconds; `[store]` keys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from relay.store.checkpoint import CHECKPOINT_MODES


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """Store tuning: counts of events and connections, bytes, seconds.

    The fields with metadata are also `[store]` keys of the same names: their
    default and rules (one-line doc, unit, minimum, choices, scope: one of
    relay.config.SCOPES) are written here once, and relay/config.py reads them
    from these fields.
    """

    synchronous: str = field(default="normal", metadata={
        "doc": "SQLite synchronous; normal survives process crashes", "choices": ("off", "normal", "full", "extra")})
    read_connections: int = field(default=4, metadata={
        "doc": "read connections serving REQ and COUNT", "unit": "connections", "min": 1, "scope": "per process"})
    writer_queue_size: int = field(default=4096, metadata={
        "doc": "events waiting for the writer; when full, connections stop reading", "unit": "events", "min": 1,
        "scope": "relay-wide, the writer's"})
    max_batch: int = field(default=1024, metadata={
        "doc": "events committed in one transaction at most", "unit": "events", "min": 1,
        "scope": "relay-wide, the writer's"})
    max_batch_bytes: int = field(default=4_194_304, metadata={
        "doc": "bytes of event JSON committed in one transaction at most (one event always fits)", "unit": "bytes",
        "scope": "relay-wide, the writer's"})
    purge_batch: int = 1000  # events per NIP-40 purge transaction (not a key)
    checkpoint_interval_seconds: float = field(default=1.0, metadata={
        "doc": "time between WAL checkpoints by a background connection; 0: the writer checkpoints itself",
        "unit": "seconds"})
    checkpoint_mode: str = field(default="passive", metadata={  # relay/store/checkpoint.py: the policy
        "doc": "the mode run after a PASSIVE round that copied the whole WAL back", "choices": CHECKPOINT_MODES})
    checkpoint_truncate_wal_bytes: int = field(default=67_108_864, metadata={
        "doc": "size of the WAL file past which a TRUNCATE is attempted; 0: never", "unit": "bytes"})
    change_log_max_entries: int = field(default=1_000_000, metadata={
        "doc": "removals kept in the change feed's log (oldest dropped first); an older cursor is refused",
        "unit": "entries", "min": 1, "scope": "relay-wide, in the database"})
    read_mmap_bytes: int = field(default=2_147_483_648, metadata={
        "doc": "bytes of the database each read connection maps (SQLite mmap_size, at most 2 GiB in SQLite's "
               "default build): pages it misses come in with the kernel's read-around; 0: plain reads",
        "unit": "bytes", "scope": "per read connection"})
    relay_urls: frozenset[tuple] = frozenset()  # this relay's URL keys (relay_url_key), for NIP-62 requests to vanish
    writer_cache_kib: int = 65_536  # the write connection's page cache (not a key; see `bulk`)

    def bulk(self) -> StoreOptions:
        """These options for a writer that takes a bulk load (`relay import` writing itself): transactions of up
        to BULK_BATCH events and a page cache of BULK_CACHE_KIB, so that an index page many events of one
        transaction touch is written once per commit, not once per `max_batch`; no subscriber waits for a
        commit's events here."""
        return dataclasses.replace(self, max_batch=max(self.max_batch, BULK_BATCH),
                                   max_batch_bytes=max(self.max_batch_bytes, BULK_BATCH_BYTES),
                                   writer_cache_kib=max(self.writer_cache_kib, BULK_CACHE_KIB))


BULK_BATCH = 32_768  # events per transaction of a bulk load at most (StoreOptions.bulk)
BULK_BATCH_BYTES = 268_435_456
BULK_CACHE_KIB = 1_048_576
