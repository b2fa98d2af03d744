"""REQ and CLOSE (NIP-01): live subscriptions, their stored results and EOSE.

How this works: a REQ replaces any subscription of the same id, then files
its live side in the relay's index BEFORE its stored query runs, so nothing
written meanwhile is missed.  A task then queries the store (one stored
answer at a time per connection), takes the answer's size from the
stored-results budget (the client IP's share of the relay's), and writes it in
chunks paced by the socket: a client that takes nothing, or too little, for
`stored_results_timeout_seconds` is dropped (1008) and the budget given back.
After EOSE come the live events that arrived meanwhile, minus those the
stored query's snapshot held: the query reads the change feed's head in the
same read transaction, and an event at a position up to it was there to be
found (a worker process learns of commits from the feed, so late: the same
check drops those it delivers after EOSE).
"""

from __future__ import annotations

import asyncio

from websockets.exceptions import ConnectionClosed

from relay.protocol.envelopes import CloseEnvelope, ReqEnvelope, encode_closed, encode_eose, encode_event
from relay.server.budget import ByteBudget
from relay.server.handlers.context import Context
from relay.server.outbox import chunks, stored_results_refusal
from relay.server.ratelimit import REQS
from relay.server.subscriptions import LiveSubscription
from relay.wire.websocket import RateWindow



class _StalledReader(Exception):
    """The peer took nothing of its stored results for `limits.stored_results_timeout_seconds`, or less than
    `limits.stored_results_min_bytes_per_second` over that long: it is dropped."""


async def handle_req(ctx: Context, req: ReqEnvelope) -> None:
    """Open a live subscription and start sending its stored results (CLOSED when refused)."""
    ctx.subscriptions.close(req.sub_id)
    if refusal := ctx.read_refusal(req.filters, REQS):
        await ctx.send(encode_closed(req.sub_id, refusal))
        return
    limit = ctx.limits.max_subscriptions
    if len(ctx.subscriptions) >= limit:
        await ctx.send(encode_closed(req.sub_id, f"rate-limited: too many subscriptions (max {limit})"))
        return
    sub = LiveSubscription(req.sub_id, req.filters, ctx.access, ctx.outbox)
    ctx.subscriptions.open(sub)  # before the stored query runs, so nothing written meanwhile is missed
    sub.task = asyncio.create_task(_serve_stored(ctx, sub))


async def handle_close(ctx: Context, envelope: CloseEnvelope) -> None:
    """End a subscription (no reply, NIP-01)."""
    ctx.subscriptions.close(envelope.sub_id)


async def _serve_stored(ctx: Context, sub: LiveSubscription) -> None:
    services, limits = ctx.services, ctx.limits
    stored: list[bytes] = []
    try:
        # One stored answer at a time per connection, from query to last chunk sent: a client
        # cannot hold every read connection, nor more than one answer of the budget.
        async with ctx.query_slot:
            # A limited client's bytes come from its IP's share, and through it from the relay's budget.
            budget = services.stored_results if ctx.rate is None else ctx.rate.stored_results
            if refusal := stored_results_refusal(budget, services.stored_results, 1):  # before the query
                raise refusal
            with services.metrics.req_seconds.time():
                stored, sub.seen_through = await services.store.query_at_head(
                    sub.filters, limits.default_limit, limits.max_limit, ctx.access.private, limits.max_query_rows,
                    limits.query_timeout_seconds, limits.max_query_bytes)
            await _send_stored(ctx, sub.sub_id, stored, budget)
        stored = None
        await ctx.send(encode_eose(sub.sub_id))
        pending, sub.pending = sub.pending, None
        push_live = ctx.outbox.push_live
        for event, seq in pending or ():
            # An event at a position up to the snapshot's head was there for the stored query (sent, or left
            # out by the limits); an ephemeral one has no position and is never stored.
            if seq is None or seq > sub.seen_through:
                push_live(encode_event(sub.sub_id, event.raw))
    except (ConnectionClosed, _StalledReader):
        pass
    except Exception as exc:
        message = ctx.query_failure("req_failed", exc, sub_id=sub.sub_id)
        ctx.subscriptions.close(sub.sub_id)
        try:
            await ctx.send(encode_closed(sub.sub_id, message))
        except ConnectionClosed:
            pass
    finally:
        # A cancelled task keeps its frame alive through the exception: let go of the results now.
        stored = None


async def _send_stored(ctx: Context, sub_id: str, stored: list[bytes], budget: ByteBudget) -> None:
    """Send stored results in chunks under `budget` (the relay's, or the client IP's share of it),
    letting go of each chunk once sent.

    Raises:
        Rejection: "rate-limited:", nothing sent: the results do not fit in the budget.
        _StalledReader: the peer took nothing for `limits.stored_results_timeout_seconds` (or too
            little: `limits.stored_results_min_bytes_per_second`); the connection is being dropped as a
            slow reader and its bytes are given back.
        ConnectionClosed: the socket is closed.
    """
    limits = ctx.limits
    held = sum(map(len, stored))
    if refusal := stored_results_refusal(budget, ctx.services.stored_results, held):
        raise refusal
    budget.take(held)
    try:
        # One rate window over the whole answer: one chunk may take less than a window.
        min_rate = limits.stored_results_min_bytes_per_second
        window = RateWindow(limits.stored_results_timeout_seconds, min_rate) if min_rate else None
        for chunk, size in chunks(stored):
            # A client that asks and never reads, or reads a trickle, must not keep its share of the budget.
            if not await ctx.send_watched([encode_event(sub_id, raw) for raw in chunk],
                                          limits.stored_results_timeout_seconds, window):
                ctx.drop_slow_reader("slow reader: stored events not read in time")
                raise _StalledReader
            budget.release(size)
            held -= size
    finally:
        budget.release(held)
