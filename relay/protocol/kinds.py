"""Names of the common event kinds, for people (the status page): `kind_label(1)` -> "1 (note)".

Each name is what the NIP defining the kind calls it, shortened; a kind not
listed is shown by its number alone.
"""

from __future__ import annotations

KIND_NAMES: dict[int, str] = {
    0: "metadata",  # NIP-01
    1: "note",  # NIP-01
    3: "follows",  # NIP-02
    4: "encrypted DM",  # NIP-04
    5: "deletion",  # NIP-09
    6: "repost",  # NIP-18
    7: "reaction",  # NIP-25
    8: "badge award",  # NIP-58
    9: "chat message",  # NIP-C7
    16: "generic repost",  # NIP-18
    40: "channel creation",  # NIP-28
    41: "channel metadata",  # NIP-28
    42: "channel message",  # NIP-28
    1063: "file metadata",  # NIP-94
    1111: "comment",  # NIP-22
    1311: "live chat message",  # NIP-53
    1984: "report",  # NIP-56
    1985: "label",  # NIP-32
    9734: "zap request",  # NIP-57
    9735: "zap",  # NIP-57
    10000: "mute list",  # NIP-51
    10002: "relay list",  # NIP-65
    10003: "bookmarks",  # NIP-51
    10050: "DM relays",  # NIP-17
    13194: "wallet info",  # NIP-47
    22242: "client auth",  # NIP-42
    23194: "wallet request",  # NIP-47
    23195: "wallet response",  # NIP-47
    24133: "nostr connect",  # NIP-46
    27235: "HTTP auth",  # NIP-98
    30000: "follow set",  # NIP-51
    30008: "profile badges",  # NIP-58
    30009: "badge definition",  # NIP-58
    30023: "long-form",  # NIP-23
    30078: "app data",  # NIP-78
    30311: "live event",  # NIP-53
    30803: "coverage claim",  # no NIP defines it: a name asked for with the status page (issue 25)
}


def kind_label(kind: int) -> str:
    """`kind` with its name when it has one: "1 (note)", "31234"."""
    name = KIND_NAMES.get(kind)
    return str(kind) if name is None else f"{kind} ({name})"
