"""One handler per client verb, each `async (ctx: Context, envelope) -> None`, looked up by envelope type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relay.protocol.envelopes import (
    AuthEnvelope,
    CloseEnvelope,
    CountEnvelope,
    EventEnvelope,
    NegCloseEnvelope,
    NegMsgEnvelope,
    NegOpenEnvelope,
    ReqEnvelope,
)
from relay.server.handlers.auth import handle_auth
from relay.server.handlers.context import Context
from relay.server.handlers.count import handle_count
from relay.server.handlers.event import handle_event
from relay.server.handlers.negentropy import handle_neg, handle_neg_open
from relay.server.handlers.req import handle_close, handle_req

HANDLERS: dict[type, Callable[[Context, object], Awaitable[None]]] = {
    EventEnvelope: handle_event,
    ReqEnvelope: handle_req,
    CloseEnvelope: handle_close,
    CountEnvelope: handle_count,
    AuthEnvelope: handle_auth,
    NegOpenEnvelope: handle_neg_open,
    NegMsgEnvelope: handle_neg,
    NegCloseEnvelope: handle_neg,
}
"""The handler of each envelope `parse_client_message` returns (relay/protocol/envelopes.py)."""
