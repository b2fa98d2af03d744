"""What ingest answers for one event: accepted or not, the NIP-01 prefix and the reason.

The store's writer answers `(accepted, message)`; `from_store` turns that
into an `Outcome` once, here, so that nobody downstream parses messages.
The outcomes a caller tells apart (a duplicate, an older version, a
deleted or expired event) are constants to compare with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay.protocol import rules
from relay.protocol.rejection import PREFIXES, Rejection
from relay.store import batch


@dataclass(frozen=True, slots=True)
class Outcome:
    """The OK answer to one event (NIP-01): `accepted`, then `prefix` ("" or one of `PREFIXES`) and `reason`.

    `settles`: a refusal of a peer's event that is final here (a write policy's, NIP-70's), which sync counts
    as settled, not as an error; not compared (the wire cannot tell).
    """

    accepted: bool
    prefix: str = ""
    reason: str = ""
    settles: bool = field(default=False, compare=False)

    @property
    def message(self) -> str:
        """The OK message as sent: "<prefix>: <reason>", or the bare reason without a prefix."""
        return f"{self.prefix}: {self.reason}" if self.prefix else self.reason

    @classmethod
    def refused(cls, rejection: Rejection, settles: bool = False) -> Outcome:
        """The refusal `rejection` stands for."""
        return cls(False, rejection.prefix, rejection.reason, settles)

    @classmethod
    def parse(cls, accepted: bool, message: str) -> Outcome:
        """The outcome of a NIP-01 OK `(accepted, message)`: a leading known prefix is split off."""
        prefix, colon, reason = message.partition(": ")
        return cls(accepted, prefix, reason) if colon and prefix in PREFIXES else cls(accepted, "", message)


ACCEPTED = Outcome(True)
"""Stored; or, for an ephemeral event, fanned out to the live subscriptions."""
DUPLICATE = Outcome.parse(*batch.DUPLICATE)
NEWER_VERSION = Outcome.parse(*batch.NEWER_VERSION)
"""A replaceable or addressable version that loses to the one held (NIP-01): not stored."""
DELETED = Outcome.parse(*batch.DELETED)
VANISHED = Outcome.parse(*batch.VANISHED)
EVICTED = Outcome.parse(*batch.EVICTED)
"""From a peer: retention removed it here (relay/store/batch.py)."""
BANNED = Outcome.parse(*batch.BANNED)
"""The event, or its author, is banned here (NIP-86, `relay ban`)."""
EXPIRED = Outcome(False, "invalid", rules.EXPIRED)
EPHEMERAL = Outcome(True, "", "ephemeral: not stored")
"""An ephemeral event from a source whose ephemeral events go to no subscription (sync, import)."""
BAD_SIGNATURE = Outcome(False, "invalid", "bad signature")
RATE_LIMITED = Outcome(False, "rate-limited", "too many events, slow down")
SHADOW_REJECTED = Outcome(True)
"""A client's event that a write policy shadow-rejected: answered as accepted, neither stored nor fanned out."""
SHADOW_ELSEWHERE = "blocked: refused by a write policy"
"""The refusal of a shadow-rejected event from a peer or an import: shadow-rejects are for clients only."""
INTERNAL = Outcome(False, "error", "internal")
"""A bug: the details go to the log (`event_failed`), never to the sender."""

_STORE = {(o.accepted, o.message): o for o in (ACCEPTED, DUPLICATE, NEWER_VERSION, DELETED, VANISHED, EVICTED,
                                                             BANNED)}


def from_store(accepted: bool, message: str) -> Outcome:
    """The outcome of the writer's `(accepted, message)` answer (`Store.enqueue`)."""
    return _STORE.get((accepted, message)) or Outcome.parse(accepted, message)
