"""COUNT (NIP-45): the number of stored events matching the filters."""

from __future__ import annotations

from relay.protocol.envelopes import CountEnvelope, encode_closed, encode_count
from relay.server.handlers.context import Context
from relay.server.ratelimit import REQS


async def handle_count(ctx: Context, req: CountEnvelope) -> None:
    """Answer COUNT, or CLOSED when refused or when the query fails."""
    if refusal := ctx.read_refusal(req.filters, REQS):
        await ctx.send(encode_closed(req.sub_id, refusal))
        return
    services = ctx.services
    try:
        async with ctx.query_slot:
            with services.metrics.count_seconds.time():
                count = await services.store.count(req.filters, ctx.access.private, ctx.limits.query_timeout_seconds)
    except Exception as exc:
        await ctx.send(encode_closed(req.sub_id, ctx.query_failure("count_failed", exc)))
        return
    await ctx.send(encode_count(req.sub_id, count))
