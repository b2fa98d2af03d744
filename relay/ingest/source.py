"""Where an event comes from, and so which rules apply to it: the one place that says so.

| source                    | name   | who may publish  | kinds | rate | origin   | evicted id | ephemeral  | NIP-70   |
|---------------------------|--------|------------------|-------|------|----------|------------|------------|----------|
| `Source.client`           | client | the connection's | yes   | yes  | ""       | stored     | fanned out | its AUTH |
| `Source.client(peer=url)` | peer   | -                | -     | -    | peer URL | refused    | fanned out | (*)      |
| `Source.peer(url)` (sync) | peer   | what was asked   | -     | -    | peer URL | refused    | not stored | (*)      |
| `IMPORT` (`relay import`) | import | -                | yes   | -    | ""       | stored     | not stored | accepted |
| `RECORD` (records)        | record | -                | -     | -    | ""       | stored     | not stored | accepted |

Every source gets the event rules (shape, id, NIP-40 expiry, the NIP-42
AUTH kind), the bans (relay/ingest/moderation.py) and the BIP-340 signature check, then the `[[policies]]` that
list its `name` (relay/ingest/policies.py).  NIP-70: a protected event is
taken only from a connection authenticated as its author (`pubkeys`);
(*) from a peer, only so, unless its `[[sync.peers]]` entry says
`nip70_events = true`.  A client that authenticated
as a configured peer (NIP-42) is that peer: it must be able to sync every
event, so no write, kind nor rate rule applies to it.  What sync asks for
is checked per request (`Ingest.accept_many`'s `screen`).
"""

from __future__ import annotations

from collections.abc import Callable, Set
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
    `ip`: a client's IP address ("" otherwise); `pubkeys`: the pubkeys its
    connection authenticated as (NIP-42; the connection's own set, which
    grows); `protected_rule`: NIP-70 applies (see the module table).
    """

    name: str
    origin: str = ""
    kind_rules: bool = False
    may_publish: Callable[[Event], None] | None = None
    rate: Callable[[], bool] | None = None
    fans_out_ephemeral: bool = False
    ip: str = ""
    pubkeys: Set[str] = frozenset()
    protected_rule: bool = True

    @classmethod
    def client(cls, may_publish: Callable[[Event], None] | None = None, rate: Callable[[], bool] | None = None,
               peer: str = "", ip: str = "", pubkeys: Set[str] = frozenset()) -> Source:
        """A client's EVENT on a WebSocket connection from `ip`, authenticated as `pubkeys`; `peer`: the URL
        of the configured peer it authenticated as (NIP-42), whose events are that peer's (see the module
        table)."""
        if peer:
            return cls("peer", origin=peer, fans_out_ephemeral=True, ip=ip, pubkeys=pubkeys)
        return cls("client", kind_rules=True, may_publish=may_publish, rate=rate, fans_out_ephemeral=True, ip=ip,
                   pubkeys=pubkeys)

    @classmethod
    def peer(cls, url: str) -> Source:
        """An event that sync fetched from the peer at `url` or that it streamed to us."""
        return cls("peer", origin=url)


IMPORT = Source("import", kind_rules=True, protected_rule=False)
"""A line of `relay import`: the operator imports (the file is their own data), so who publishes is not checked."""


RECORD = Source("record", protected_rule=False)
"""An event the node signed from a row of a declared projector (relay/ingest/records.py): the operator's own
writes, so neither who publishes nor the `[auth]` kinds are checked (the projector declares the kind)."""
