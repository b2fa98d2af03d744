"""Write policies: what decides, per event, whether the relay takes it (accept, reject, or shadow-reject).

A policy is a function `policy(event, source) -> Verdict`, or a coroutine
function (async), named by a `[[policies]]` entry's `call = "module:function"`;
with an `options` table, `call` names a factory called once at start-up with
those options as keyword arguments, which returns the policy.  `event` is a
`relay.protocol.event.Event` whose signature has been checked; `source` is the
`relay.ingest.Source` it came from: `source.name` ("client", "peer" or
"import"), `source.ip` (a client's IP address, "" otherwise),
`source.pubkeys` (the pubkeys the connection authenticated as, NIP-42) and
`source.origin` (the peer's URL, "" otherwise).

The verdict is `ACCEPT`, `reject("<message>")` (a message without a NIP-01
prefix gets "blocked: ") or `SHADOW_REJECT` (answered `OK true`, neither
stored nor broadcast; from clients only: from another source it is a
refusal).  relay/ingest/policies.py runs the chain; relay/policies/builtin.py
ships a few; relay/policies/plugin.py runs a strfry write-policy plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.protocol.rejection import PREFIXES


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's decision: `action` is "accept", "reject" or "shadowReject" (strfry's words); `message` is the
    OK message of a rejection, always with a NIP-01 prefix; `policy`, the name of the `[[policies]]` entry
    that refused (set by the relay, not by a policy)."""

    action: str
    message: str = ""
    policy: str = ""


ACCEPT = Verdict("accept")
SHADOW_REJECT = Verdict("shadowReject")
ACTIONS = ("accept", "reject", "shadowReject")


def reject(message: str = "") -> Verdict:
    """A rejection answered `OK false` with `message`; "blocked: " is put before a message without a NIP-01
    prefix (an empty one reads "blocked: refused by policy")."""
    prefix, colon, _ = message.partition(":")
    if not (colon and prefix in PREFIXES):
        message = f"blocked: {message or 'refused by policy'}"
    return Verdict("reject", message)
