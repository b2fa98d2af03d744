"""EVENT (NIP-01): take it through ingest (rules, signature, store), then answer OK.

How this works: the handler waits while the connection has
`max_events_in_flight` EVENTs without an OK written, or the writer queue is
full (back-pressure: the read loop stops), then hands the event to the one
ingest path (relay/ingest/: the connection's source rules, the signature
pool, the writer) without a task per event, ending in `_answer`, which
queues the OK in the outbox (the slot is freed once it is written).
"""

from __future__ import annotations

from functools import partial

from relay.ingest import Outcome
from relay.protocol.envelopes import EventEnvelope, encode_notice, encode_ok
from relay.protocol.event import event_ref
from relay.server.handlers.context import Context


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
    await wait_for_slot(ctx)
    await ctx.services.ingest.wait_for_room()
    if outbox.closed or ctx.draining:
        return  # the socket is gone or the relay is stopping: not taken, never answered
    outbox.take_slot()
    _check(ctx, envelope.event)


async def wait_for_slot(ctx: Context) -> None:
    """Wait while the connection has `max_events_in_flight` OKs not yet written (back-pressure: the read
    loop stops), or until its outbox closes."""
    if ctx.outbox.in_flight >= ctx.limits.max_events_in_flight:
        await ctx.outbox.slot_freed()


async def reply_in_order(ctx: Context, message: bytes) -> None:
    """Queue `message` (an OK) behind every reply already queued, holding an in-flight slot as an EVENT's OK.

    An OK written at once could overtake an EVENT's OK decided before it and still queued: nostr-sdk,
    refused "auth-required:", waits for the next AUTH OK, and one that came first was missed (NIP-42).
    """
    await wait_for_slot(ctx)
    if not ctx.outbox.closed:
        ctx.outbox.take_slot()
        ctx.outbox.push_ok(message)


def _check(ctx: Context, obj: object) -> None:
    ctx.services.metrics.events_received.inc()
    ref = event_ref(obj)
    ctx.services.ingest.submit(obj, ctx.source, partial(_answer, ctx, ref))


def _answer(ctx: Context, ref: object, outcome: Outcome) -> None:
    if outcome.prefix == "auth-required":
        ctx.challenge()
    ctx.services.metrics.event_answered(outcome)
    ctx.outbox.push_ok(ok(ref, outcome.accepted, outcome.message))
