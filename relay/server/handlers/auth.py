"""AUTH (NIP-42): prove a pubkey to this connection; a configured peer's key makes it that peer."""

from __future__ import annotations

import time

import structlog

from relay.ingest import Source
from relay.protocol.envelopes import AuthEnvelope, encode_ok
from relay.protocol.rejection import Rejection
from relay.server.handlers.context import Context
from relay.server.handlers.event import ok, reply_in_order
from relay.server.ratelimit import EVENTS, REFUSALS

log = structlog.get_logger(__name__)


async def handle_auth(ctx: Context, envelope: AuthEnvelope) -> None:
    """Check the signed kind-22242 event and answer OK; a peer's or a trusted pubkey's connection is no longer
    rate limited."""
    obj = envelope.event
    ref = obj.get("id")
    if ctx.rate is not None and not ctx.rate.allow(EVENTS):  # an AUTH costs a signature check, as an EVENT
        await reply_in_order(ctx, ok(ref, False, REFUSALS[EVENTS]))
        return
    try:
        pubkey = ctx.access.authenticate(obj, ctx.services.event_limits, time.time())
    except Rejection as rejection:
        await reply_in_order(ctx, ok(ref, False, str(rejection)))
        return
    # a configured peer (sync traffic), or [rate_limits] trusted_pubkeys / NIP-86 trustpubkey: not rate limited
    if ctx.access.origin or (ctx.rate is not None and ctx.services.trusted(pubkey)):
        ctx.services.rate_limits.close(ctx.rate)
        ctx.rate = None
        ctx.source = Source.client(ctx.source.may_publish, peer=ctx.access.origin, ip=ctx.source.ip,
                                   pubkeys=ctx.access.pubkeys)
    log.info("authenticated", pubkey=pubkey, peer=ctx.access.origin or None)
    await reply_in_order(ctx, encode_ok(ref, True, ""))
