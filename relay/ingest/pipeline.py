"""The one path of every event into the relay: parse, event rules, signature, writer queue, outcome.

How this works: `submit(obj, source, done)` checks what needs no waiting,
cheapest first: the source's rate limit, `parse_event` (shape, limits, id),
the event rules of relay/protocol/rules.py (expiry, the AUTH kind), the bans
(moderation.py), then, as the `Source` says, the kind rules and who may publish.  The event
then goes to the one pool of signature-checking threads (`Verifier`); back
on the loop, a valid event is queued for the writer (`Store.enqueue`) with
the source's origin, or, when ephemeral, handed to `live` (the fan-out) or
dropped, as the source says.  Between the signature and the writer, NIP-70
(`rules.check_protected`, with the connection's pubkeys) and the
`[[policies]]` listing the source (policies.py): a shadow-reject from a
client is answered `OK true` and goes nowhere; a peer's event that a policy
refuses is recorded as settled (relay/store/refused.py), so sync does not
fetch it again, and every refusal sent as one goes to the short log the
status page shows.  `done(outcome)` runs once: at once for a refusal, after the
COMMIT for a stored event.  A client's EVENT costs callbacks only, no task
(unless a policy awaits); `accept_many` runs a batch (sync, import) through
the same steps and awaits its outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Protocol

import structlog

from relay.config import Config
from relay.ingest.outcome import (
    ACCEPTED,
    BAD_SIGNATURE,
    EPHEMERAL,
    INTERNAL,
    RATE_LIMITED,
    SHADOW_ELSEWHERE,
    SHADOW_REJECTED,
    Outcome,
    from_store,
)
from relay.ingest.moderation import Moderation
from relay.ingest.policies import Policies
from relay.ingest.source import Source
from relay.ingest.verifier import Verifier
from relay.policies import Verdict
from relay.protocol import rules
from relay.protocol.envelopes import loads
from relay.protocol.event import Event, EventLimits, event_ref, is_ephemeral, parse_event
from relay.protocol.rejection import Rejection
from relay.store import refused
from relay.store.reads import ReadPool
from relay.store.store import Jobs, Store

log = structlog.get_logger(__name__)

Done = Callable[[Outcome], None]
Screen = Callable[[Event], None]


class Forward(Jobs, Protocol):
    """The channel to the writer process (relay/channel/worker.py `WriterChannel`): ingest's last stage and its
    jobs run there."""

    def submit(self, event: Event, source: Source, done: Done) -> None:
        """Hand a checked event to the writer process; `done(outcome)` once it is settled there."""


class Ingest:
    """Takes events from every source into `store`; one per process, closed with `close()`.

    `limits` bound each event (NIP-11 `limitation`); `kinds` are the `[auth]`
    kind rules; `threads` check signatures; `live(event)` fans an ephemeral
    event out to the live subscriptions (None: there are none); `moderation`
    holds the operator's effective rules (bans, kinds of config and database;
    None: the `[auth]` kinds alone); `policies` are the write policies; `nip70_peers` the URLs of the peers whose
    protected events are taken (NIP-70).
    """

    def __init__(self, store: ReadPool, limits: EventLimits | None = None, kinds: rules.KindRules | None = None,
                 threads: int = 2, live: Callable[[Event], None] | None = None,
                 moderation: Moderation | None = None, policies: Policies | None = None,
                 nip70_peers: frozenset[str] = frozenset(), forward: Forward | None = None) -> None:
        self.store = store
        self.limits = limits or EventLimits()
        self.kinds = kinds or rules.KindRules()
        self.verifier = Verifier(threads)
        self.live = live
        self.moderation = moderation  # bans and the kinds of config and database together (moderation.py)
        self.policies = policies or Policies()
        self.nip70_peers = nip70_peers
        self._refused: list[tuple[bytes, str]] = []  # peers' events refused by a policy, to record as settled
        # policy refusals to log for people (refused.py), as many as the log keeps
        self._logged: deque[tuple[str, int, str, str, str]] = deque(maxlen=refused.LOG_ROWS)
        # Where events and store jobs go: this process's writer (`store`, a `Store`), or `forward`, the local
        # channel to the writer process (relay/channel/), which runs the last stage and the jobs.
        self.writer: Forward | Store = forward or store
        # The last stage, after NIP-70: the policies and the writer queue here (`take_verified`), or the channel.
        self.sink: Callable[[Event, Source, Done], None] = self.take_verified if forward is None else forward.submit
        # What callers await before they submit (back-pressure): the writer queue's room, or the channel's.
        self.wait_for_room: Callable[[], Awaitable[None]] = self.writer.wait_for_room
        self._recording: asyncio.Task | None = None

    @classmethod
    def from_config(cls, config: Config, store: ReadPool, live: Callable[[Event], None] | None = None,
                    moderation: Moderation | None = None, forward: Forward | None = None) -> Ingest:
        """The ingest of `config`: `[limits]` for events, `[auth]` kinds, `store.verify_threads`, `[[policies]]`;
        with `moderation`, its effective rules instead of the `[auth]` kinds alone; `forward`: the channel to
        the writer process (a worker, a command through the running relay; None: `store` is this process's
        `Store`).

        Raises:
            ConfigError: a policy's module cannot be loaded (relay/ingest/policies.py `load`).
        """
        auth = config.auth
        return cls(store, config.limits.event_limits(), rules.KindRules.of(auth.allow_kinds, auth.deny_kinds),
                   config.store.verify_threads, live, moderation=moderation, policies=Policies.load(config.policies),
                   nip70_peers=frozenset(p.url for p in config.sync.peers if p.nip70_events), forward=forward)

    def submit(self, obj: object, source: Source, done: Done, screen: Screen | None = None) -> Event | None:
        """Take one event from `source`; `done(outcome)` runs on the loop once it is settled.

        `obj` is the event as a decoded JSON object, or its JSON text (bytes).
        `screen(event)`, right after parsing, raises a `Rejection` for an event
        the sender should not have sent (sync: not asked for).  Callers that
        can wait should `await self.wait_for_room()` first (back-pressure).
        Returns the parsed event, or None when it was refused before its
        signature check.
        """
        if source.rate is not None and not source.rate():
            done(RATE_LIMITED)
            return None
        try:
            event = self._check(obj, source, screen)
        except Rejection as rejection:
            done(Outcome.refused(rejection))
            return None
        except Exception as exc:
            done(_internal(exc, event_ref(obj)))
            return None
        self.verifier.verify(event, partial(self._verified, event, source, done))
        return event

    async def accept_many(self, objects: Sequence[object], source: Source,
                          screen: Screen | None = None) -> list[tuple[Outcome, Event | None]]:
        """Take a batch of events from `source` (see `submit`), once the writer queue has room; returns each
        one's outcome with its parsed event (None when refused before its signature check), in order."""
        await self.wait_for_room()
        return await self._all_settled(lambda i, obj, done: self.submit(obj, source, done, screen), objects)

    async def accept_checked_many(self, checked: Sequence[Event | Outcome], source: Source,
                                  handed: asyncio.Future | None = None) -> list[tuple[Outcome, Event | None]]:
        """`accept_many` of what `relay.ingest.checking.check_lines` made of a batch of lines: each `Event` through
        `submit_checked`, each `Outcome` (refused there) answered as it is.  `handed`, when given, is set once
        every event is queued (before their outcomes), so that the next batch can follow it in order."""
        await self.wait_for_room()

        def take(i: int, item: Event | Outcome, done: Done) -> Event | None:
            if isinstance(item, Outcome):
                done(item)
                return None
            self.submit_checked(item, source, done)
            return item

        return await self._all_settled(take, checked, handed)

    async def _all_settled(self, take: Callable[[int, object, Done], Event | None], items: Sequence[object],
                           handed: asyncio.Future | None = None) -> list[tuple[Outcome, Event | None]]:
        """`take(i, item, done)` of each item, then wait for every outcome (and the refusals' record)."""
        if not items:
            handed is None or handed.set_result(None)
            return []
        outcomes: list[Outcome | None] = [None] * len(items)
        left = len(items)
        all_done = asyncio.get_running_loop().create_future()

        def done(i: int, outcome: Outcome) -> None:
            nonlocal left
            outcomes[i] = outcome
            left -= 1
            if left == 0 and not all_done.done():
                all_done.set_result(None)

        events = [take(i, item, partial(done, i)) for i, item in enumerate(items)]
        handed is None or handed.set_result(None)
        await all_done
        if self._recording is not None:
            await asyncio.shield(self._recording)  # the refusals are settled before the caller reads them
        return list(zip(outcomes, events))

    def close(self) -> None:
        """Stop the signature-checking threads (after the checks they hold) and kill the policies' plugins."""
        self.verifier.close()
        self.policies.close()

    async def aclose(self) -> None:
        """`close()`, then wait until the policies' plugin processes have exited."""
        self.close()
        await self.policies.wait_closed()

    def submit_checked(self, event: Event, source: Source, done: Done) -> None:
        """`submit` of an event whose shape, id, event rules and signature another process of this relay checked
        (relay/ingest/checking.py, for `relay import`): the checks of this process's state (bans, kind rules,
        who may publish), then as `submit`."""
        try:
            self._admit(event, source)
        except Rejection as rejection:
            done(Outcome.refused(rejection))
            return
        self._verified(event, source, done, True)

    def _check(self, obj: object, source: Source, screen: Screen | None) -> Event:
        if type(obj) is bytes:
            obj = loads(obj)
        now = time.time()
        event = parse_event(obj, self.limits, now)
        if screen is not None:
            screen(event)
        rules.check_event(event, now)
        self._admit(event, source)
        return event

    def _admit(self, event: Event, source: Source) -> None:
        """The checks of `event` against the operator's rules: bans, kind rules, who may publish (`Rejection`)."""
        if self.moderation is not None:
            self.moderation.check(event, source.kind_rules)
        elif source.kind_rules:
            self.kinds.check(event.kind)
        if source.may_publish is not None:
            source.may_publish(event)

    def _verified(self, event: Event, source: Source, done: Done, valid: bool) -> None:
        if not valid:
            done(BAD_SIGNATURE)
            return
        if source.protected_rule and source.origin not in self.nip70_peers:
            try:
                rules.check_protected(event, source.pubkeys)
            except Rejection as rejection:
                done(Outcome.refused(rejection, settles=bool(source.origin)))
                return
        self.sink(event, source, done)

    def take_verified(self, event: Event, source: Source, done: Done) -> None:
        """The writer's side of ingest: `event`, already parsed and signature-checked (here, or by a worker
        process: relay/channel/), through the `[[policies]]` listing `source`, then to the writer queue, or
        live when ephemeral; `done(outcome)` as for `submit`."""
        chain = self.policies.chain(source)
        if chain:
            self.policies.judge(event, source, chain, partial(self._judged, event, source, done))
        else:
            self._take(event, source, done)

    def _judged(self, event: Event, source: Source, done: Done, verdict: Verdict) -> None:
        if verdict.action == "accept":
            self._take(event, source, done)
        elif verdict.action == "shadowReject" and source.name == "client":
            done(SHADOW_REJECTED)  # invariant 1's one exception (docs/architecture.md): OK true, nothing stored, no fan-out
        else:
            outcome = Outcome.parse(False, verdict.message if verdict.action == "reject" else SHADOW_ELSEWHERE)
            if outcome.prefix != "error":  # a policy's failure is the relay's, not the event's
                if source.origin:
                    outcome = dataclasses.replace(outcome, settles=True)
                self._record_refused(event, source, verdict.policy, outcome)
            done(outcome)

    def _record_refused(self, event: Event, source: Source, policy: str, outcome: Outcome) -> None:
        """Queue the refusal for the log, and a peer's event's id as settled for peer sync
        (relay/store/refused.py); one writer job at a time."""
        self._logged.append((event.id, event.kind, source.name, policy, outcome.message))
        if outcome.settles:
            self._refused.append((bytes.fromhex(event.id), source.origin))
        if self._recording is None:
            self._recording = asyncio.ensure_future(self._record_all())

    async def _record_all(self) -> None:
        try:
            while self._refused or self._logged:
                batch, self._refused = self._refused, []
                logged = list(self._logged)
                self._logged.clear()
                await self.writer.run_job(refused.record, batch, int(time.time()), refused.MAX_ROWS, logged)
        except Exception as exc:  # a failed writer stops the relay elsewhere; the ids are fetched again later
            log.error("policy_refusals_not_recorded", error=repr(exc))
        finally:
            self._recording = None

    def _take(self, event: Event, source: Source, done: Done) -> None:
        try:
            if not is_ephemeral(event.kind):
                self.writer.enqueue(event, source.origin, partial(_stored, done))
                return
            # (kind 22242, AUTH's, is ephemeral but refused before: rules.reject_auth_kind)
            outcome = ACCEPTED if source.fans_out_ephemeral else EPHEMERAL
            if outcome is ACCEPTED and self.live is not None:
                self.live(event)
        except Exception as exc:
            outcome = _internal(exc, event.id)
        done(outcome)


def _stored(done: Done, accepted: bool, message: str) -> None:
    done(from_store(accepted, message))


def _internal(exc: Exception, event_id: object) -> Outcome:
    """Log a bug met while taking an event, with its traceback; the sender is told only "error: internal"."""
    log.error("event_failed", error=repr(exc), exc_info=exc, event_id=event_id)
    return INTERNAL
