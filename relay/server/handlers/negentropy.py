"""NEG-OPEN, NEG-MSG and NEG-CLOSE (NIP-77): answered by the connection's sessions (relay/server/negentropy.py)."""

from __future__ import annotations

from relay.protocol.envelopes import NegCloseEnvelope, NegMsgEnvelope, NegOpenEnvelope
from relay.server.handlers.context import Context
from relay.server.ratelimit import NEG_OPENS
from relay.server.search import NEG_OPEN_REFUSAL


async def handle_neg_open(ctx: Context, envelope: NegOpenEnvelope) -> None:
    """Open a session (NEG-MSG), or NEG-ERR when the rate limit or NIP-42 refuses its filter, or it holds a
    NIP-50 search (no index of fingerprints can serve one)."""
    if envelope.filter.search is not None:
        await ctx.negentropy.refuse(envelope.sub_id, NEG_OPEN_REFUSAL)
    elif refusal := ctx.read_refusal([envelope.filter], NEG_OPENS):
        await ctx.negentropy.refuse(envelope.sub_id, refusal)
    else:
        await ctx.negentropy.handle(envelope)


async def handle_neg(ctx: Context, envelope: NegMsgEnvelope | NegCloseEnvelope) -> None:
    """Answer a NEG-MSG, or end a session on NEG-CLOSE; answered in order, one message at a time."""
    await ctx.negentropy.handle(envelope)
