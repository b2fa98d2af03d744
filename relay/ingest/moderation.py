"""The effective moderation rules: the configuration's and the database's together, in memory.

How this works: `Moderation` holds a copy of the `moderation` table
(relay/store/moderation.py) that every check reads without I/O: ingest asks
`check` for each event (bans, then the kinds), connections ask `is_blocked`
for each message, AUTH asks `is_trusted`, NIP-11 asks `info`.  A change
(NIP-86, `relay ban`) is one writer job, after which the copy is read again
before the change returns, so it applies to the next message on every
connection.  `refresh_forever` reads it again whenever another process (the
`relay ban` command) has changed the table (`moderation_version`).

Which rule wins: a deny in either place wins.  Kinds: `[auth] allow_kinds`
plus NIP-86 `allowkind` make one allow list (empty: every kind), and
`[auth] deny_kinds` plus `disallowkind` one deny list; each call undoes the
other first (`set_kind`), so both database lists can be emptied again.  Writers: `[auth]
write_pubkeys` plus `allowpubkey` (they matter when `[auth] write` is
`listed` or `authenticated`).  A banned event or author is refused from
every source.  NIP-86's name, description and icon override `[info]` until
set back to "".
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Iterable, Sequence

import structlog

from relay.config import Config
from relay.ingest.outcome import BANNED
from relay.protocol.event import Event
from relay.protocol.rejection import Rejection
from relay.protocol.rules import KindRules
from relay.store import bans
from relay.store import moderation as table
from relay.store.moderation import (
    ALLOWED_KIND,
    ALLOWED_PUBKEY,
    BANNED_EVENT,
    BANNED_PUBKEY,
    BLOCKED_IP,
    DISALLOWED_KIND,
    INFO,
    LISTS,
    PURGE_PUBKEY,
    TRUSTED_PUBKEY,
    Entry,
)
from relay.store.reads import ReadPool
from relay.store.store import Jobs, Store

log = structlog.get_logger(__name__)

_MAX_CACHED_IPS = 65_536  # client IPs whose blocked-or-not answer is remembered until the next change


def admin_ban_refusal(pubkey: str) -> str:
    """Why 64-hex `pubkey`, one of `[admin] pubkeys`, may not be banned."""
    return f"{pubkey} is an admin of this relay: remove it from [admin] pubkeys in the configuration first"


class Refused(Exception):
    """A change the relay's writer refuses under its own configuration (`Moderation.refusal`); says why in a line.

    The writer answers it as the job's result (it pickles), and `Moderation` raises it where the change was asked.
    """


class Moderation:
    """The moderation rules of one relay over `store`; `await load()` before the first check.

    `runs_purges`: this process removes banned pubkeys' events in the
    background (the relay); the `relay ban` command purges in the foreground.
    `writer` runs its changes: `store` (this process's `Store`), or the channel to the writer process
    (a worker, a command through the running relay).
    """

    def __init__(self, store: ReadPool, config: Config, runs_purges: bool = False, writer: Jobs | None = None
                 ) -> None:
        self.store = store
        self.writer: Jobs | Store = writer or store
        self.config = config
        self.runs_purges = runs_purges
        self.version = -1
        self.lists: dict[str, dict[str, Entry]] = {name: {} for name in LISTS}
        self.kinds = KindRules.of(config.auth.allow_kinds, config.auth.deny_kinds)
        self._writers = frozenset(config.auth.write_pubkeys)
        self._trusted = frozenset(config.rate_limits.trusted_pubkeys)
        self._blocked_networks: list = []
        self._blocked_ips: dict[str, bool] = {}
        self._purges: dict[str, asyncio.Task] = {}

    @classmethod
    async def open(cls, store: ReadPool, config: Config, runs_purges: bool = False, writer: Jobs | None = None
                   ) -> Moderation:
        """The moderation rules of `store`, loaded (and, with `runs_purges`, unfinished purges resumed); `writer`
        as in `Moderation`."""
        moderation = cls(store, config, runs_purges, writer)
        await moderation.load()
        return moderation

    # --- checks (no I/O) -------------------------------------------------------------------------

    def check(self, event: Event, kind_rules: bool) -> None:
        """Refuse `event` when it or its author is banned, or (`kind_rules`: the source's) its kind is refused.

        Raises:
            Rejection: "blocked:".
        """
        if event.id in self.lists[BANNED_EVENT] or event.pubkey in self.lists[BANNED_PUBKEY]:
            raise Rejection(BANNED.prefix, BANNED.reason)
        if kind_rules:
            self.kinds.check(event.kind)

    def is_banned_event(self, event_id: str) -> bool:
        """True when the event of 64-hex `event_id` is banned (peer sync does not fetch it)."""
        return event_id in self.lists[BANNED_EVENT]

    def may_write(self, pubkey: str) -> bool:
        """True when `pubkey` is listed as a writer: `[auth] write_pubkeys` or NIP-86 `allowpubkey`."""
        return pubkey in self._writers or pubkey in self.lists[ALLOWED_PUBKEY]

    @property
    def lists_writers(self) -> bool:
        """True when any writer is listed (`may_write` then decides for `[auth] write = authenticated`)."""
        return bool(self._writers or self.lists[ALLOWED_PUBKEY])

    def is_trusted(self, pubkey: str) -> bool:
        """True when a connection authenticated as `pubkey` is not rate limited (`[rate_limits] trusted_pubkeys`,
        NIP-86 `trustpubkey`)."""
        return pubkey in self._trusted or pubkey in self.lists[TRUSTED_PUBKEY]

    def is_blocked(self, ip: str) -> bool:
        """True when the client IP `ip` is blocked (NIP-86 `blockip`: an address or a network); read for each
        message, so the answer is remembered per IP until the lists change."""
        if not self._blocked_networks:
            return False
        blocked = self._blocked_ips.get(ip)
        if blocked is None:
            try:
                address = ipaddress.ip_address(ip)
            except ValueError:
                address = None
            blocked = address is not None and any(address in network for network in self._blocked_networks)
            if len(self._blocked_ips) >= _MAX_CACHED_IPS:
                self._blocked_ips.clear()
            self._blocked_ips[ip] = blocked
        return blocked

    def info(self) -> dict[str, str]:
        """The NIP-11 fields NIP-86 overrides (name, description, icon), by field."""
        return {field: entry.reason for field, entry in self.lists[INFO].items()}

    def refusal(self, job: Callable, args: tuple) -> Refused | None:
        """Why this relay's writer refuses a job another process sent (`relay ban` through the channel): a ban of
        one of its `[admin] pubkeys`, which the sender's configuration may not list; None to run it."""
        if job is bans.set_entries:
            for entry in args[0]:
                if entry.list == BANNED_PUBKEY and entry.item in self.config.admin.pubkeys:
                    return Refused(admin_ban_refusal(entry.item))
        return None

    def entries(self, name: str) -> list[Entry]:
        """The entries of the list `name` (relay/store/moderation.py `LISTS`), oldest first."""
        return list(self.lists[name].values())

    def effective(self, name: str) -> list[Entry]:
        """`entries(name)` after those the configuration lists: `[auth] write_pubkeys` for ALLOWED_PUBKEY,
        `[rate_limits] trusted_pubkeys` for TRUSTED_PUBKEY (reason "config: <key>"), each pubkey once."""
        configured = {ALLOWED_PUBKEY: (self._writers, "config: [auth] write_pubkeys"),
                      TRUSTED_PUBKEY: (self._trusted, "config: [rate_limits] trusted_pubkeys")}.get(name)
        if configured is None:
            return self.entries(name)
        pubkeys, reason = configured
        return [Entry(name, p, reason) for p in sorted(pubkeys)] + [e for e in self.entries(name)
                                                                    if e.item not in pubkeys]

    async def reported(self, limit: int) -> list[tuple[str, str]]:
        """Stored events reported with NIP-56 and neither banned nor allowed: (id, report type), at most `limit`
        (see relay/store/moderation.py `reported_events`)."""
        return await self.store.read_snapshot(table.reported_events, limit)

    # --- changes (one writer job each, then the copy is read again) --------------------------------

    async def add(self, name: str, item: str, reason: str = "", drop: Sequence[str] = ()) -> None:
        """Put `item` on the list `name` with `reason`, taking it off the lists `drop`."""
        await self.writer.run_job(bans.set_entries, [Entry(name, item, reason, int(time.time()))], drop)
        await self.load()

    async def remove(self, names: Sequence[str], item: str) -> bool:
        """Take `item` off the lists `names`; False when it was on none."""
        gone = await self.writer.run_job(bans.remove_entry, names, item)
        await self.load()
        return gone

    async def set_kind(self, kind: int, allow: bool, reason: str = "") -> bool:
        """NIP-86 `allowkind` (`allow`) or `disallowkind` of `kind` (0..65535), on the database's lists: a kind on
        the opposite list is only taken off it (True); another is put on this one (False).  So `allowkind k`
        after `disallowkind k` goes back to the rules before, and not to "only k is allowed"."""
        name, opposite = (ALLOWED_KIND, DISALLOWED_KIND) if allow else (DISALLOWED_KIND, ALLOWED_KIND)
        lifted = await self.writer.run_job(bans.lift_or_set, Entry(name, str(kind), reason, int(time.time())),
                                          opposite)
        await self.load()
        return lifted

    async def ban_event(self, event_id: str, reason: str = "") -> bool:
        """Ban the event of 64-hex `event_id` and remove it if stored (True then); see relay/store/bans.py."""
        removed = await self.writer.run_job(bans.ban_event, Entry(BANNED_EVENT, event_id, reason, int(time.time())))
        await self.load()
        log.info("event_banned", event_id=event_id, removed=removed)
        return removed

    async def ban_pubkey(self, pubkey: str, reason: str = "", purge: bool | None = None) -> None:
        """Ban 64-hex `pubkey`: its new events are refused; with `purge` (None: `[admin] purge_on_ban`) its
        stored ones are removed too, in the background when `runs_purges` (else call `purge`)."""
        purge = self.config.admin.purge_on_ban if purge is None else purge
        now = int(time.time())
        entries = [Entry(BANNED_PUBKEY, pubkey, reason, now)] + ([Entry(PURGE_PUBKEY, pubkey, "", now)] if purge
                                                                  else [])
        refused = await self.writer.run_job(bans.set_entries, entries, (ALLOWED_PUBKEY,))
        await self.load()
        if isinstance(refused, Refused):  # by the writer of the relay serving the database (`refusal`)
            raise refused
        log.info("pubkey_banned", pubkey=pubkey, purge=purge)

    async def purge(self, pubkey: str, in_background: bool = False) -> int:
        """Remove the stored events of banned `pubkey` in steps of `[admin] purge_batch_size`; returns how many.

        `in_background` (the relay's own purges): a failing step is tried again with back-off and listed by
        `relay status` (`Store.run_retried`); else its `JobFailed` ends the purge (a command says so)."""
        batch, removed = self.config.admin.purge_batch_size, 0
        step = f"purge of banned pubkey {pubkey}"
        while True:
            count = await (self.writer.run_retried(step, bans.purge_step, pubkey, batch) if in_background
                           else self.writer.run_job(bans.purge_step, pubkey, batch))
            removed += count
            if count < batch:
                return removed

    # --- the copy --------------------------------------------------------------------------------

    async def load(self) -> None:
        """Read every list from the database (a newer copy already held is kept)."""
        version, entries = await self.store.read_snapshot(table.load)
        if version >= self.version:
            self._apply(version, entries)

    async def refresh_forever(self) -> None:
        """Read the lists again whenever another process changed them, every `[admin] refresh_seconds`."""
        while True:
            await asyncio.sleep(self.config.admin.refresh_seconds)
            try:
                if await self.store.read_snapshot(table.version) != self.version:
                    await self.load()
            except Exception as exc:  # the one place this task catches: log, try again next time
                log.error("moderation_refresh_failed", error=repr(exc), exc_info=exc)

    def close(self) -> None:
        """Stop background purges (they resume at the next start)."""
        for task in self._purges.values():
            task.cancel()

    def _apply(self, version: int, entries: Iterable[Entry]) -> None:
        lists: dict[str, dict[str, Entry]] = {name: {} for name in LISTS}
        for entry in entries:
            lists.setdefault(entry.list, {})[entry.item] = entry
        self.version, self.lists = version, lists
        auth = self.config.auth
        self.kinds = KindRules.of({*auth.allow_kinds, *map(int, lists[ALLOWED_KIND])},
                                  {*auth.deny_kinds, *map(int, lists[DISALLOWED_KIND])})
        self._blocked_networks = [ipaddress.ip_network(ip, strict=False) for ip in lists[BLOCKED_IP]]
        self._blocked_ips = {}
        if self.runs_purges:
            self._schedule_purges(set(lists[PURGE_PUBKEY]))

    def _schedule_purges(self, pending: set[str]) -> None:
        for pubkey, task in list(self._purges.items()):
            if pubkey not in pending or task.done():
                task.cancel()  # unbanned meanwhile, or finished
                del self._purges[pubkey]
        for pubkey in pending - self._purges.keys():
            self._purges[pubkey] = asyncio.create_task(self._purge_logged(pubkey), name=f"purge-{pubkey[:8]}")

    async def _purge_logged(self, pubkey: str) -> None:
        started = time.monotonic()
        try:
            removed = await self.purge(pubkey, in_background=True)
        except Exception as exc:  # the one place a purge task catches: its row stays, resumed at the next start
            log.error("purge_failed", pubkey=pubkey, error=repr(exc), exc_info=exc)
            return
        log.info("pubkey_purged", pubkey=pubkey, removed=removed, seconds=round(time.monotonic() - started, 3))
