"""An independent model of the NIP-01/09/40 live event set, for checking what a relay serves."""

from __future__ import annotations


def first_tag(event: dict, name: str) -> str | None:
    return next((t[1] for t in event["tags"] if len(t) > 1 and t[0] == name), None)


def is_replaceable(kind: int) -> bool:
    return kind in (0, 3) or 10000 <= kind < 20000


def is_addressable(kind: int) -> bool:
    return 30000 <= kind < 40000


def expected_live(events: list[dict], now: float) -> dict[str, dict]:
    """An independent model of what a NIP-01/09/40 relay keeps of `events`, whatever their order.

    Ephemeral kinds and expired events are not kept; per replaceable/addressable
    coordinate the newest (lowest id on a tie) version; then each kind 5
    removes its author's events named by `e` tags (not deletions) and the
    author's versions up to its created_at of the coordinates named by `a` tags.
    """
    kept: dict[str, dict] = {}
    newest: dict[tuple, dict] = {}
    for e in events:
        kind = e["kind"]
        expiration = first_tag(e, "expiration")
        if 20000 <= kind < 30000:
            continue
        if expiration is not None and expiration.isdigit() and len(expiration) <= 18 and int(expiration) <= now:
            continue
        if is_replaceable(kind) or is_addressable(kind):
            key = (kind, e["pubkey"], (first_tag(e, "d") or "") if is_addressable(kind) else "")
            best = newest.get(key)
            if best is None or (e["created_at"], best["id"]) > (best["created_at"], e["id"]):
                newest[key] = e
        else:
            kept[e["id"]] = e
    kept.update({e["id"]: e for e in newest.values()})
    deleted_until: dict[tuple, int] = {}  # coordinate -> newest created_at of an `a` deletion naming it
    for deletion in [e for e in kept.values() if e["kind"] == 5]:
        for tag in deletion["tags"]:
            if len(tag) < 2:
                continue
            if tag[0] == "e":
                target = kept.get(tag[1])
                if target is not None and target["pubkey"] == deletion["pubkey"] and target["kind"] != 5:
                    del kept[tag[1]]
            elif tag[0] == "a":
                parts = tag[1].split(":", 2)
                if len(parts) != 3 or parts[1] != deletion["pubkey"] or not parts[0].isdigit():
                    continue
                kind = int(parts[0])
                key = (kind, deletion["pubkey"], parts[2] if is_addressable(kind) else "")
                deleted_until[key] = max(deleted_until.get(key, -1), deletion["created_at"])
    for i, x in list(kept.items()):  # one pass: a relay may hold thousands of `a` deletions
        kind = x["kind"]
        if is_replaceable(kind) or is_addressable(kind):
            key = (kind, x["pubkey"], (first_tag(x, "d") or "") if is_addressable(kind) else "")
            if x["created_at"] <= deleted_until.get(key, -1):
                del kept[i]
    return kept
