"""Who may write and read what: `[auth]` rules and `[[sync.peers]]` identities, per connection (NIP-42).

How this works: `AccessPolicy` holds the rules every connection shares.
Each connection gets a `ConnectionAccess` with its own challenge and the set
of pubkeys it has authenticated as (several are allowed).  Authenticating as
the pubkey of a configured peer makes the connection that peer: its events
are stored with the peer's URL as origin (so peer sync never pushes them back
to it), and no write rule nor private kind applies to it (it must be able to
sync them).  Refusals follow NIP-42: "auth-required:" while the connection has
not authenticated, "restricted:" once it has but is still not allowed.
The kinds refused to everyone (`allow_kinds`, `deny_kinds`) are a rule of
ingest (relay/protocol/rules.py `KindRules`, applied as `relay.ingest.Source` says).
"""

from __future__ import annotations

import secrets

from relay.config import AuthConfig, PeerConfig
from relay.ingest.moderation import Moderation
from relay.protocol.auth import PrivateKinds, check_auth_event
from relay.protocol.event import Event, EventLimits
from relay.protocol.filters import Filter
from relay.protocol.rejection import Rejection


class AccessPolicy:
    """The `[auth]` rules and the peers' pubkeys (pubkey -> peer URL), shared by every connection."""

    def __init__(self, config: AuthConfig, peers: tuple[PeerConfig, ...] = (),
                 moderation: Moderation | None = None) -> None:
        """`moderation`: the writers NIP-86 `allowpubkey` adds to `write_pubkeys` (None: the config's only)."""
        self.config = config
        self.write_pubkeys = frozenset(config.write_pubkeys)
        self.moderation = moderation
        self.private_kinds = frozenset(config.private_kinds)
        self.peer_urls: dict[str, str] = {}
        for peer in peers:
            if peer.pubkey:
                self.peer_urls.setdefault(peer.pubkey, peer.url)  # one node at two URLs: the first is its origin

    def check_write(self, event: Event, pubkeys: set[str]) -> None:
        """Refuse `event` unless `[auth]` lets a connection authenticated as `pubkeys` publish it.

        Raises:
            Rejection: "auth-required:" when authenticating could help, "restricted:" when it did not.
        """
        write = self.config.write
        if write == "all" or (write == "listed" and self.is_listed(event.pubkey)):
            return
        if not pubkeys:
            who = "listed authors" if write == "listed" else "authenticated users"
            raise Rejection("auth-required", f"this relay accepts events only from {who} (NIP-42 AUTH)")
        lists = self.moderation.lists_writers if self.moderation is not None else bool(self.write_pubkeys)
        if (write == "listed" or lists) and not any(map(self.is_listed, pubkeys)):
            raise Rejection("restricted", "this pubkey may not publish here")

    def is_listed(self, pubkey: str) -> bool:
        """True when `pubkey` is a listed writer: `[auth] write_pubkeys`, or NIP-86 `allowpubkey`."""
        return self.moderation.may_write(pubkey) if self.moderation is not None else pubkey in self.write_pubkeys


class ConnectionAccess:
    """One connection's NIP-42 state: its challenge, the pubkeys it proved, and what follows from them.

    `relay_url` is what the `relay` tag of its AUTH events must name.
    `origin` is the peer URL once it authenticated as a peer ("" otherwise);
    `private` what it may see of the private kinds (None: everything).
    """

    def __init__(self, policy: AccessPolicy, relay_url: str) -> None:
        self.policy = policy
        self.relay_url = relay_url
        self.challenge = secrets.token_hex(16)
        self.challenged = False  # the challenge was sent
        self.pubkeys: set[str] = set()
        self.origin = ""
        self.private = PrivateKinds(policy.private_kinds) if policy.private_kinds else None

    @property
    def checks_writes(self) -> bool:
        """Whether this connection's EVENTs go through `check_write`: not for a peer (its node key)."""
        return self.policy.config.write != "all" and not self.origin

    def authenticate(self, obj: object, limits: EventLimits, now: float) -> str:
        """Check a client's AUTH event (NIP-42) and add its pubkey to this connection's; returns the pubkey.

        Raises:
            Rejection: "invalid:" (see `check_auth_event`).
        """
        config = self.policy.config
        pubkey = check_auth_event(obj, self.challenge, self.relay_url, now, config.max_age_seconds, limits).pubkey
        self.pubkeys.add(pubkey)
        peer_url = self.policy.peer_urls.get(pubkey)
        if peer_url and not self.origin:
            self.origin = peer_url
            self.private = None
        elif self.private is not None:
            self.private = PrivateKinds(self.private.kinds, frozenset(self.pubkeys))
        return pubkey

    def check_write(self, event: Event) -> None:
        """Refuse `event` unless this connection may publish it; see `AccessPolicy.check_write`."""
        self.policy.check_write(event, self.pubkeys)

    def check_read(self, filters: list[Filter]) -> None:
        """Refuse a REQ, COUNT or NEG-OPEN naming private kinds from a connection that has not authenticated.

        Filters that merely could match them are served without them (see `private`).

        Raises:
            Rejection: "auth-required:" (NIP-42).
        """
        private = self.private
        if private is None or private.readers:
            return
        for f in filters:
            if f.kinds is not None and not private.kinds.isdisjoint(f.kinds):
                kinds = ", ".join(map(str, sorted(private.kinds)))
                raise Rejection("auth-required", f"kinds {kinds} are served only to their authenticated author "
                                                 "or recipient (NIP-42 AUTH)")

    def may_read(self, event: Event) -> bool:
        """True when this connection may receive `event` (live fan-out of a private kind)."""
        return self.private is None or self.private.may_read(event)
