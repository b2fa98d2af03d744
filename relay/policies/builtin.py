"""Policies shipped with the relay: factories for `[[policies]]` entries with an `options` table.

    [[policies]]
    call = "relay.policies.builtin:pubkey_list"
    options = { deny_file = "/etc/relay/denied.txt" }

Each factory checks its options (`ValueError` naming the bad one, which stops
the start) and returns the policy, `policy(event, source) -> Verdict`.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from relay.policies import ACCEPT, Verdict, reject
from relay.protocol.event import MAX_KIND, Event, is_hex64

Policy = Callable[[Event, object], Verdict]

MAX_AUTHORS = 100_000
"""`author_rate`: authors whose buckets are kept at most (the least recently seen are dropped first)."""


class _PubkeyFile:
    """The 64-hex pubkeys of a file (one per line; blank lines and `#` comments skipped), read again when its
    modification time changes, looked at no more than once a second."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.mtime = -1.0
        self.checked = 0.0
        self.pubkeys: frozenset[str] = frozenset()
        self.refresh(time.monotonic())

    def refresh(self, now: float) -> frozenset[str]:
        if now - self.checked >= 1.0:
            self.checked = now
            mtime = os.stat(self.path).st_mtime  # a file gone while serving: the policy fails (error:, logged)
            if mtime != self.mtime:
                self.pubkeys, self.mtime = _read_pubkeys(self.path), mtime
        return self.pubkeys


def _read_pubkeys(path: str) -> frozenset[str]:
    pubkeys = set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if line and not is_hex64(line):
                raise ValueError(f"{path}:{number}: not a 64-hex pubkey: {line!r}")
            if line:
                pubkeys.add(line)
    return frozenset(pubkeys)


def pubkey_list(allow_file: str = "", deny_file: str = "") -> Policy:
    """Authors allowed (`allow_file`: only those) and denied (`deny_file`), from files of 64-hex pubkeys read
    again when they change, so an operator can stop a spammer without a restart.

    Refuses with "blocked:".  Raises ValueError when neither file is given or one cannot be read.
    """
    if not allow_file and not deny_file:
        raise ValueError("pubkey_list: give allow_file, deny_file or both")
    allow = _PubkeyFile(allow_file) if allow_file else None
    deny = _PubkeyFile(deny_file) if deny_file else None

    def check(event: Event, source: object) -> Verdict:
        now = time.monotonic()
        if deny is not None and event.pubkey in deny.refresh(now):
            return reject("blocked: this pubkey may not publish here")
        if allow is not None and event.pubkey not in allow.refresh(now):
            return reject("blocked: this pubkey is not on the allow list")
        return ACCEPT

    return check


def max_size(bytes_per_kind: Mapping[str, int] | None = None, default_bytes: int = 0) -> Policy:
    """Events larger than their kind's bound are refused ("blocked:"): `bytes_per_kind` maps a kind (a TOML key,
    so a string: `{ "0" = 8192 }`) to bytes of the whole event's JSON; `default_bytes` bounds the other kinds
    (0: no bound).  Raises ValueError for a kind out of 0..65535 or a bound below 0."""
    bounds: dict[int, int] = {}
    for kind, limit in (bytes_per_kind or {}).items():
        if not str(kind).isdecimal() or not 0 <= int(kind) <= MAX_KIND:
            raise ValueError(f"max_size: bytes_per_kind: not a kind: {kind!r}")
        if type(limit) is not int or limit < 0:
            raise ValueError(f"max_size: bytes_per_kind.{kind}: must be bytes >= 0, got {limit!r}")
        bounds[int(kind)] = limit
    if type(default_bytes) is not int or default_bytes < 0:
        raise ValueError(f"max_size: default_bytes: must be bytes >= 0, got {default_bytes!r}")

    def check(event: Event, source: object) -> Verdict:
        bound = bounds.get(event.kind, default_bytes)
        if bound and len(event.raw) > bound:
            return reject(f"blocked: events of kind {event.kind} are limited to {bound} bytes")
        return ACCEPT

    return check


def difficulty(event: Event) -> int:
    """NIP-13: the leading zero bits of the event id, capped by the target committed in its `nonce` tag
    (`["nonce", "<n>", "<target>"]`), so that an event that hit more zeros by luck is not taken for more work."""
    value = int(event.id, 16)
    zeros = 256 - value.bit_length()
    for tag in event.tags:
        if len(tag) > 2 and tag[0] == "nonce":
            committed = tag[2]
            return min(zeros, int(committed)) if committed.isdecimal() else 0
    return zeros


def min_pow(bits: int = 20, kinds: list[int] | None = None) -> Policy:
    """NIP-13 proof of work: events (of `kinds`, or every kind) with a `difficulty` below `bits` are refused
    with "pow:".  Raises ValueError for bits outside 1..256."""
    if type(bits) is not int or not 1 <= bits <= 256:
        raise ValueError(f"min_pow: bits: must be 1 to 256, got {bits!r}")
    only = frozenset(kinds) if kinds else None

    def check(event: Event, source: object) -> Verdict:
        if only is not None and event.kind not in only:
            return ACCEPT
        found = difficulty(event)
        if found < bits:
            return reject(f"pow: difficulty {found} is less than {bits}")
        return ACCEPT

    return check


def author_rate(events_per_minute: float = 60.0, burst: int = 20, max_authors: int = MAX_AUTHORS) -> Policy:
    """A token bucket per author (pubkey): `burst` events at once, then `events_per_minute`; past it,
    "rate-limited:".  Buckets of at most `max_authors` authors are kept (least recently seen dropped first: a
    dropped author starts again with a full bucket).  Raises ValueError for a rate <= 0 or a burst < 1."""
    if not (type(events_per_minute) in (int, float) and events_per_minute > 0) or type(burst) is not int or burst < 1:
        raise ValueError("author_rate: events_per_minute must be > 0 and burst >= 1")
    per_second = events_per_minute / 60.0
    buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # pubkey -> (tokens, monotonic seconds)

    def check(event: Event, source: object) -> Verdict:
        now = time.monotonic()
        tokens, then = buckets.pop(event.pubkey, (float(burst), now))
        tokens = min(float(burst), tokens + (now - then) * per_second)
        allowed = tokens >= 1.0
        buckets[event.pubkey] = (tokens - 1.0 if allowed else tokens, now)
        if len(buckets) > max_authors:
            buckets.popitem(last=False)
        return ACCEPT if allowed else reject("rate-limited: this author publishes too fast, slow down")

    return check
