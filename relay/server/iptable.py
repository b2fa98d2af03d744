"""The per-IP rate-limit state every worker process of one relay shares: a table in an mmap'd file.

How this works: the writer creates the file (`IpTable.create`, in the relay's
runtime directory) before it spawns workers; each worker opens it
(`IpTable.open`) with its index.  The file is a header (magic, slot count,
worker count, a random hash key) and a fixed number of slots.  A client IP is
hashed with the key (blake2b, 64 bits: a client cannot aim at one slot) and
lives in one group of `GROUP` consecutive slots (linear probing inside the
group); each group has one lock, a `fcntl.lockf` byte-range lock on its first
byte, which works between any processes that open the file.  A slot holds the
IP's hash, when it was last used, each token bucket's (tokens, last refill)
and, per worker, its open connections and the bytes of unsent REQ results it
holds for the IP.  A slot whose counts are all zero and whose buckets have
refilled is free again (no state is lost: a fresh slot starts full); when a
group has no free slot, the idle one used longest ago is taken, as the
in-process table drops its oldest idle IP.  Counting per worker lets the
writer clear what a dead worker held (`clear_worker`).  Times are
`time.monotonic()` seconds, one clock for every process of the machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import secrets
import struct
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

GROUP = 8
"""Slots one IP may live in (its group); one lock per group."""
DEFAULT_SLOTS = 65_536
"""Slots in a table by default (about 100 + 16 * workers bytes each, touched only when used)."""
ACTIONS = 3
"""Token buckets per IP: EVENTs, REQs, NEG-OPENs (relay/server/ratelimit.py's action numbers)."""

_MAGIC = b"relayip1"
_HEADER = struct.Struct("=8sII16s")  # magic, slots, workers, hash key
_HEADER_BYTES = 64
_FIXED = struct.Struct("=Qd" + "dd" * ACTIONS)  # hash (0: never used), last used, (tokens, last refill) per action
_COUNTS = struct.Struct("=qq")  # per worker: connections open, bytes of unsent REQ results held


class TableFull(Exception):
    """No slot of an IP's group can be given to it (each holds another IP's connections or bytes)."""


class IpTable:
    """One process's view of the shared table; use `create` (writer) or `open` (worker).

    `buckets` gives each action's (rate per second, burst); a rate <= 0 is
    not limited.  Every method takes the group's lock for a few struct reads
    and writes; a slot number stays valid while this worker counts a
    connection or bytes in it.
    """

    def __init__(self, path: Path, worker: int, buckets: Sequence[tuple[float, int]]) -> None:
        self.path = Path(path)
        self.worker = worker
        self.buckets = tuple(buckets)
        # An idle IP's buckets are full again after this long: its slot can then be given to another IP.
        self.refill_seconds = max((burst / rate for rate, burst in self.buckets if rate > 0), default=0.0)
        self._fd = os.open(self.path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 0)
        magic, self.slots, self.workers, self._key = _HEADER.unpack_from(self._map, 0)
        if magic != _MAGIC or not 0 <= worker < self.workers:
            self.close()
            raise ValueError(f"{self.path}: not a rate-limit table for worker {worker}")
        self._slot_bytes = _FIXED.size + _COUNTS.size * self.workers

    @classmethod
    def create(cls, path: str | Path, workers: int, buckets: Sequence[tuple[float, int]],
               slots: int = DEFAULT_SLOTS) -> IpTable:
        """Make a fresh, empty table at `path` (mode 0600, replacing any old one) for `workers` workers; the
        writer's own view (worker 0).  `slots` is rounded up to a whole number of groups."""
        slots = -(-slots // GROUP) * GROUP
        size = _HEADER_BYTES + slots * (_FIXED.size + _COUNTS.size * workers)
        temporary = Path(f"{path}.new")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: zero pages cost nothing until used
            os.pwrite(fd, _HEADER.pack(_MAGIC, slots, workers, secrets.token_bytes(16)), 0)
        finally:
            os.close(fd)
        os.replace(temporary, path)  # a worker never opens a half-written table
        return cls(Path(path), 0, buckets)

    @classmethod
    def open(cls, path: str | Path, worker: int, buckets: Sequence[tuple[float, int]]) -> IpTable:
        """Worker `worker`'s view of the table the writer created at `path`.

        Raises:
            OSError: no such file; ValueError: not a table, or `worker` out of its range.
        """
        return cls(Path(path), worker, buckets)

    def close(self) -> None:
        """Unmap and close (this process's locks go with the descriptor)."""
        if not self._map.closed:
            self._map.close()
        os.close(self._fd)

    def hash_of(self, ip: str) -> int:
        """The IP's 64-bit keyed hash, never 0 (0 marks a slot never used)."""
        digest = hashlib.blake2b(ip.encode(), digest_size=8, key=self._key).digest()
        return int.from_bytes(digest, "little") or 1

    # --- connections -------------------------------------------------------------------------------------------

    def connect(self, ip: str, cap: int = 0) -> int | None:
        """Count one more connection of `ip` for this worker and return its slot; None when `cap` (> 0) are
        open already across all workers.

        Raises:
            TableFull: every slot of the IP's group holds another IP's connections or bytes.
        """
        key = self.hash_of(ip)
        with self._group(key) as group:
            slot = self._find(group, key, time.monotonic())
            if slot is None:
                raise TableFull(ip)
            if cap and self._total(slot, 0) >= cap:
                return None
            self._add(slot, 0, 1)
            return slot

    def connections(self, ip: str) -> int:
        """The connections of `ip` open across all workers."""
        key = self.hash_of(ip)
        with self._group(key) as group:
            slot = next((s for s in group if self._hash(s) == key), None)
            return 0 if slot is None else self._total(slot, 0)

    def disconnect(self, slot: int) -> None:
        """One connection this worker counted in `slot` is closed."""
        with self._locked(slot):
            self._add(slot, 0, -1)

    # --- token buckets and bytes -------------------------------------------------------------------------------

    def take(self, slot: int, action: int) -> bool:
        """Take a token of `action`'s bucket in `slot`; False when it is empty (not limited: always True)."""
        rate, burst = self.buckets[action]
        if rate <= 0:
            return True
        with self._locked(slot):
            base = self._offset(slot) + 16 + 16 * action
            tokens, last = struct.unpack_from("=dd", self._map, base)
            now = time.monotonic()
            tokens = min(float(burst), tokens + (now - last) * rate)
            taken = tokens >= 1.0
            struct.pack_into("=dd", self._map, base, tokens - 1.0 if taken else tokens, now)
            return taken

    def held(self, slot: int) -> int:
        """Bytes of unsent REQ results all workers hold for `slot`'s IP."""
        with self._locked(slot):
            return self._total(slot, 1)

    def reserve(self, slot: int, n: int, cap: int) -> bool:
        """Count `n` more bytes for this worker unless all workers' together would pass `cap`."""
        with self._locked(slot):
            if self._total(slot, 1) + n > cap:
                return False
            self._add(slot, 1, n)
            return True

    def release(self, slot: int, n: int) -> None:
        """Give back `n` bytes this worker counted in `slot`."""
        with self._locked(slot):
            self._add(slot, 1, -n)

    def clear_worker(self, worker: int) -> None:
        """Forget what worker `worker` counted (its connections and bytes): it died, with its connections.
        The writer calls this before it starts the worker again."""
        for first in range(0, self.slots, GROUP):
            with self._group_at(first):
                for slot in range(first, first + GROUP):
                    if self._hash(slot):
                        _COUNTS.pack_into(self._map, self._offset(slot) + _FIXED.size + _COUNTS.size * worker, 0, 0)

    # --- inside a group's lock ---------------------------------------------------------------------------------

    def _offset(self, slot: int) -> int:
        return _HEADER_BYTES + slot * self._slot_bytes

    def _hash(self, slot: int) -> int:
        return struct.unpack_from("=Q", self._map, self._offset(slot))[0]

    def _total(self, slot: int, field: int) -> int:
        base = self._offset(slot) + _FIXED.size + 8 * field
        return sum(struct.unpack_from("=q", self._map, base + _COUNTS.size * w)[0] for w in range(self.workers))

    def _add(self, slot: int, field: int, n: int) -> None:
        base = self._offset(slot) + _FIXED.size + _COUNTS.size * self.worker + 8 * field
        struct.pack_into("=q", self._map, base, struct.unpack_from("=q", self._map, base)[0] + n)
        struct.pack_into("=d", self._map, self._offset(slot) + 8, time.monotonic())

    def _idle(self, slot: int, now: float) -> float | None:
        """How long `slot` has been idle (no connection, no bytes), or None when it is in use."""
        if self._total(slot, 0) or self._total(slot, 1):
            return None
        return now - struct.unpack_from("=d", self._map, self._offset(slot) + 8)[0]

    def _find(self, group: range, key: int, now: float) -> int | None:
        """`key`'s slot in `group`, else a free one (or the longest idle) claimed for it with full buckets."""
        free, idlest, longest = None, None, -1.0
        for slot in group:
            found = self._hash(slot)
            if found == key:
                return slot
            if not found:
                free = slot if free is None else free
                continue
            idle = self._idle(slot, now)
            if idle is not None and idle > longest:
                idlest, longest = slot, idle
        slot = free if free is not None else idlest
        if slot is not None:
            full = [value for _, burst in self.buckets for value in (float(burst), now)]
            _FIXED.pack_into(self._map, self._offset(slot), key, now, *full)
            counts = self._offset(slot) + _FIXED.size
            self._map[counts:counts + _COUNTS.size * self.workers] = bytes(_COUNTS.size * self.workers)
        return slot

    @contextmanager
    def _group(self, key: int):
        first = key % (self.slots // GROUP) * GROUP
        with self._group_at(first):
            yield range(first, first + GROUP)

    def _locked(self, slot: int):
        return self._group_at(slot - slot % GROUP)

    @contextmanager
    def _group_at(self, first: int):
        # One byte per group, past the header: POSIX record locks exclude other processes, not this one's
        # other callers, which the event loop runs one at a time.
        fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, _HEADER_BYTES + first)
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _HEADER_BYTES + first)
