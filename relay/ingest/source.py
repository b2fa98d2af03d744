"""Where an event comes from, and so which rules apply to it: the one place that says so.

| source                           | who may publish    | kind rules | rate limit | origin   | evicted id | ephemeral   |
|----------------------------------|--------------------|------------|------------|----------|------------|-------------|
| `Source.client`                  | the connection's   | yes        | yes        | ""       | stored     | fanned out  |
| `Source.client(peer=url)`        | -                  | -          | -          | peer URL | refused    | fanned out  |
| `Source.peer(url)` (sync)        | what was asked for | -          | -          | peer URL | refused    | not stored  |
| `IMPORT` (`relay import`)        | -                  | yes        | -          | ""       | stored     | not stored  |

Every source gets the event rules (shape, id, NIP-40 expiry, the NIP-42
AUTH kind), the bans (relay/ingest/moderation.py) and the BIP-340 signature
check.  A client that authenticated
as a configured peer (NIP-42) is that peer: it must be able to sync every
event, so no write, kind nor rate rule applies to it.  What sync asks for
is checked per request (`Ingest.accept_many`'s `screen`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relay.protocol.event import Event


@dataclass(frozen=True, slots=True)
class Source:
    """The rules one source's events go through; build one with `client`, `peer` or use `IMPORT`.

    `origin`: "" (published here) or the peer's URL, stored with the event
    (sync never pushes an event back to its origin).  `kind_rules`: the
    `[auth]` allow and deny kinds apply.  `may_publish(event)` raises a
    `Rejection` when the sender may not publish it (None: anyone may).
    `rate()` takes one EVENT token, False when the sender is over its rate
    (None: not limited).  `fans_out_ephemeral`: an ephemeral event goes to
    the live subscriptions; else it is answered `EPHEMERAL`, and dropped.
    """

    name: str
    origin: str = ""
    kind_rules: bool = False
    may_publish: Callable[[Event], None] | None = None
    rate: Callable[[], bool] | None = None
    fans_out_ephemeral: bool = False

    @classmethod
    def client(cls, may_publish: Callable[[Event], None] | None = None, rate: Callable[[], bool] | None = None,
               peer: str = "") -> Source:
        """A client's EVENT on a WebSocket connection; `peer`: the URL of the configured peer it authenticated
        as (NIP-42), whose events are that peer's (see the module table)."""
        if peer:
            return cls("client", origin=peer, fans_out_ephemeral=True)
        return cls("client", kind_rules=True, may_publish=may_publish, rate=rate, fans_out_ephemeral=True)

    @classmethod
    def peer(cls, url: str) -> Source:
        """An event that sync fetched from the peer at `url` or that it streamed to us."""
        return cls("peer", origin=url)


IMPORT = Source("import", kind_rules=True)
"""A line of `relay import`: the operator imports, so who publishes is not checked."""
