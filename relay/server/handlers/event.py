"""EVENT (NIP-01): check, verify the signature, store, then answer OK.

How this works: the handler waits while the connection has
`max_events_in_flight` EVENTs without an OK written, or the writer queue is
full (back-pressure: the read loop stops), then starts the pipeline without a
task per event: parse and policy checks here, then callbacks from the
signature verifier and from the writer, ending in `_answer`, which queues the
OK in the outbox (the slot is freed once it is written).
"""

from __future__ import annotations

import time
from functools import partial

from relay.protocol.envelopes import EventEnvelope, encode_notice, encode_ok
from relay.protocol.event import Event, parse_event
from relay.protocol.rejection import Rejection
from relay.server import policies
from relay.server.handlers.context import Context, Done
from relay.server.ratelimit import EVENTS, REFUSALS


def ok(ref: object, accepted: bool, message: str) -> bytes:
    """The OK answering an EVENT or AUTH whose id is `ref` (NIP-01: every EVENT gets one).

    A 64-character string is echoed even when it is not a valid id (e.g.
    uppercase hex), so the client can match the refusal to what it sent; a
    NOTICE when `ref` is not such a string (missing, another type or size).
    """
    return encode_ok(ref, accepted, message) if type(ref) is str and len(ref) == 64 else encode_notice(message)


async def handle_event(ctx: Context, envelope: EventEnvelope) -> None:
    """Take one EVENT once a slot and the writer queue have room; its OK comes later, through the outbox."""
    outbox = ctx.outbox
    if outbox.in_flight >= ctx.limits.max_events_in_flight:
        await outbox.slot_freed()
    await ctx.services.store.wait_for_room()
    if outbox.closed or ctx.draining:
        return  # the socket is gone or the relay is stopping: not taken, never answered
    outbox.take_slot()
    _check(ctx, envelope.event)


def _check(ctx: Context, obj: object) -> None:
    services = ctx.services
    services.metrics.events_received.inc()
    ref = obj.get("id") if type(obj) is dict else None
    done = partial(_answer, ctx, ref)
    if ctx.rate is not None and not ctx.rate.allow(EVENTS):
        done(False, REFUSALS[EVENTS])
        return
    try:
        now = time.time()
        event = parse_event(obj, services.event_limits, now)
        policies.check_event(event, now)
        if ctx.access.checks_writes:
            ctx.access.check_write(event)
    except Rejection as rejection:
        if rejection.prefix == "auth-required":
            ctx.challenge()
        done(False, str(rejection))
        return
    except Exception as exc:
        done(False, services.internal_error("event_failed", exc, event_id=ref))
        return
    services.verifier.verify(event, partial(_verified, ctx, event, done))


def _verified(ctx: Context, event: Event, done: Done, valid: bool) -> None:
    if not valid:
        done(False, "invalid: bad signature")
        return
    try:
        ctx.services.accept(event, done, ctx.access.origin)
    except Exception as exc:
        done(False, ctx.services.internal_error("event_failed", exc, event_id=event.id))


def _answer(ctx: Context, ref: object, accepted: bool, message: str) -> None:
    ctx.services.metrics.event_answered(accepted, message)
    ctx.outbox.push_ok(ok(ref, accepted, message))
