"""Nostr events: validation, NIP-01 id, BIP-340 signature, kind classes (NIP-01, NIP-40).

An `Event` is built only by `parse_event`, which checks, cheapest first: shape
and types, limits, the id recomputed from the NIP-01 serialization, then (with
`verify_signature`, usually on a worker thread) the BIP-340 signature.  The
relay stores and serves `Event.raw`, its own canonical re-serialization.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache

import orjson
from coincurve import PublicKeyXOnly

from relay.protocol.rejection import Rejection, invalid

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX256 = re.compile(r"[0-9a-f]{256}")
_INT64_MAX = 2**63 - 1
MAX_KIND = 65535


def is_hex64(value: object) -> bool:
    """True for a 64-char lowercase hex string (an event id or pubkey)."""
    return type(value) is str and len(value) == 64 and _HEX64.fullmatch(value) is not None


def is_decimal(text: str) -> bool:
    """True for a non-empty string of ASCII digits 0-9 only (str.isdigit also accepts "²" and "３")."""
    return text.isascii() and text.isdigit()


def is_replaceable(kind: int) -> bool:
    """NIP-01: kinds 0, 3 and 10000-19999 keep one event per (kind, pubkey)."""
    return kind == 0 or kind == 3 or 10000 <= kind < 20000


def is_ephemeral(kind: int) -> bool:
    """NIP-01: kinds 20000-29999 are relayed live and never stored."""
    return 20000 <= kind < 30000


def is_addressable(kind: int) -> bool:
    """NIP-01: kinds 30000-39999 keep one event per (kind, pubkey, d tag)."""
    return 30000 <= kind < 40000


def kind_class(kind: int) -> str:
    """The NIP-01 storage class: "regular", "replaceable", "ephemeral" or "addressable"."""
    if is_replaceable(kind):
        return "replaceable"
    if is_ephemeral(kind):
        return "ephemeral"
    if is_addressable(kind):
        return "addressable"
    return "regular"


@dataclass(frozen=True, slots=True)
class EventLimits:
    """Per-event limits checked by `parse_event` (counts, bytes, seconds).

    They are the `[limits]` keys max_event_tags, max_content_bytes and
    max_created_at_future_seconds: default and rules are written here once, in
    field metadata that relay/config.py reads (scope: one of relay.config.SCOPES).
    """

    max_tags: int = field(default=10_000, metadata={"doc": "tags per event", "unit": "tags", "scope": "per event"})
    max_content_bytes: int = field(default=262_144, metadata={
        "doc": "bytes of content per event (UTF-8)", "unit": "bytes", "scope": "per event"})
    max_created_at_future_seconds: int = field(default=900, metadata={
        "doc": "how far created_at may be ahead of the relay's clock", "unit": "seconds", "scope": "per event"})


@dataclass(slots=True, eq=False)
class Event:
    """A validated event (NIP-01); treat it as immutable (not frozen only because that is slower to build).

    `raw` is the canonical JSON of the whole event as UTF-8 bytes, keys in
    NIP-01 order; `d_tag` is the first `d` tag's value ("" when absent) and
    `expiration` the NIP-40 expiry in unix seconds or None.
    """

    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: list
    content: str
    sig: str
    raw: bytes
    d_tag: str
    expiration: int | None

    @property
    def coordinate(self) -> tuple[int, str, str] | None:
        """(kind, pubkey, d_tag) for replaceable/addressable events, else None (NIP-01)."""
        if is_replaceable(self.kind):
            return (self.kind, self.pubkey, "")
        if is_addressable(self.kind):
            return (self.kind, self.pubkey, self.d_tag)
        return None

    def tag_values(self, name: str) -> list[str]:
        """The first values (position 1) of every tag called `name`, in order."""
        return [t[1] for t in self.tags if len(t) > 1 and t[0] == name]

    def has_expired(self, now: float) -> bool:
        """NIP-40: True once `now` (unix seconds) has reached the expiration."""
        return self.expiration is not None and self.expiration <= now


def _explain_hex(event_id: object, pubkey: object, sig: object) -> None:
    for name, value, size in (("id", event_id, 64), ("pubkey", pubkey, 64), ("sig", sig, 128)):
        if type(value) is not str or len(value) != size or not _HEX256.fullmatch(value * (256 // size)):
            raise invalid(f"{name} must be {size} lowercase hex characters")


def _check_int(obj: dict, key: str, low: int, high: int) -> int:
    value = obj.get(key)
    # JSON integers past 64 bits arrive as floats: one message names the type and the range
    if type(value) is not int or not low <= value <= high:
        raise invalid(f"{key} must be an integer from {low} to {high}")
    return value


def _check_tags(tags: object, limits: EventLimits) -> list:
    if type(tags) is not list:
        raise invalid("tags must be an array of arrays of strings")
    if len(tags) > limits.max_tags:
        raise invalid(f"too many tags (max {limits.max_tags})")
    for tag in tags:
        if type(tag) is not list:
            raise invalid("tags must be an array of arrays of strings")
        if not tag:  # NIP-01: "each tag is an array of one or more strings"
            raise invalid("a tag must hold at least one string")
        for item in tag:
            if type(item) is not str:
                raise invalid("tag items must be strings")
    return tags


def _first_tag_value(tags: list, name: str) -> str | None:
    for tag in tags:
        if len(tag) > 1 and tag[0] == name:
            return tag[1]
    return None


def _expiration(tags: list) -> int | None:
    value = _first_tag_value(tags, "expiration")
    # NIP-40: a value that is not a unix timestamp carries no expiry.
    if value is None or not is_decimal(value) or len(value) > 18:
        return None
    return int(value)


def _tag_fields(tags: list) -> tuple[str, int | None]:
    """The `Event` fields read from its tags: (`d_tag`: the first `d` value or "", NIP-40 `expiration`)."""
    return _first_tag_value(tags, "d") or "", _expiration(tags)


RAW_ID = slice(7, 71)
"""Where the id sits in `Event.raw` (bytes): `{"id":"<64 hex>",...`, the first key of our serialization."""


def event_ref(obj: object) -> object:
    """The `id` field of a JSON event object as received (any type, unchecked), or None when it is no object:
    what an OK, a log line or an internal error names before the event is parsed."""
    return obj.get("id") if type(obj) is dict else None


def serialize_for_id(pubkey: str, created_at: int, kind: int, tags: list, content: str) -> bytes:
    """The NIP-01 id preimage `[0,pubkey,created_at,kind,tags,content]` as UTF-8.

    Compact, non-ASCII verbatim, only the JSON escapes NIP-01 lists plus
    lowercase `\\u00xx` for other control characters (what orjson emits).

    Raises:
        Rejection: "invalid:" when a string holds a lone surrogate.
    """
    try:
        return orjson.dumps([0, pubkey, created_at, kind, tags, content])
    except TypeError:
        raise invalid("string holds a lone surrogate (not valid UTF-8)") from None


def parse_event(obj: object, limits: EventLimits, now: float) -> Event:
    """Validate one event object from an EVENT message, all but its signature.

    `now` is unix seconds (for the future-timestamp limit). Fields other than
    the seven of NIP-01 are dropped.

    Raises:
        Rejection: "invalid:" for a wrong shape or type, non-lowercase or
        wrong-length hex, a limit exceeded, or an id that does not match.
    """
    if type(obj) is not dict:
        raise invalid("event must be a JSON object")
    event_id, pubkey, sig = obj.get("id"), obj.get("pubkey"), obj.get("sig")
    # One regex pass over all three in the common case; the field at fault is named otherwise.
    if not (type(event_id) is str and type(pubkey) is str and type(sig) is str
            and len(event_id) == 64 and len(pubkey) == 64 and len(sig) == 128
            and _HEX256.fullmatch(event_id + pubkey + sig)):
        _explain_hex(event_id, pubkey, sig)
    created_at = _check_int(obj, "created_at", 0, _INT64_MAX)
    kind = _check_int(obj, "kind", 0, MAX_KIND)
    tags = _check_tags(obj.get("tags"), limits)
    content = obj.get("content")
    if type(content) is not str:
        raise invalid("content must be a string")
    preimage = serialize_for_id(pubkey, created_at, kind, tags, content)
    # A character is at most 4 UTF-8 bytes: encode only when it could matter.
    if len(content) * 4 > limits.max_content_bytes and len(content.encode()) > limits.max_content_bytes:
        raise invalid(f"content too long (max {limits.max_content_bytes} bytes)")
    if created_at > now + limits.max_created_at_future_seconds:
        raise invalid("created_at is too far in the future")
    if hashlib.sha256(preimage).hexdigest() != event_id:
        raise invalid("event id does not match")
    raw = orjson.dumps(
        {"id": event_id, "pubkey": pubkey, "created_at": created_at, "kind": kind,
         "tags": tags, "content": content, "sig": sig}
    )
    return Event(event_id, pubkey, created_at, kind, tags, content, sig, raw, *_tag_fields(tags))


def trusted_event(raw: bytes) -> Event:
    """The `Event` of canonical JSON that this relay already checked (id and signature), with no check.

    For the relay's own processes only: a worker hands the writer events it
    verified, and reads committed ones back from the change feed.  Never call
    it on bytes from a client or a peer: use `parse_event` and the verifier.
    """
    obj = orjson.loads(raw)
    return _trusted(obj, raw, *_tag_fields(obj["tags"]))


def trusted_event_object(obj: dict, d_tag: str, expiration: int | None) -> Event:
    """`trusted_event` of the object decoded from an event's canonical JSON (embedded in a channel frame with
    `orjson.Fragment`, so a frame is decoded once): orjson serializes it back to the same bytes, keys in order.
    `d_tag` and `expiration` are the `Event` fields its sender had found in its tags."""
    return _trusted(obj, orjson.dumps(obj), d_tag, expiration)


def _trusted(obj: dict, raw: bytes, d_tag: str, expiration: int | None) -> Event:
    return Event(obj["id"], obj["pubkey"], obj["created_at"], obj["kind"], obj["tags"], obj["content"], obj["sig"],
                 raw, d_tag, expiration)


def verify_signature(event: Event) -> bool:
    """BIP-340 check of `event.sig` over the 32-byte id by the x-only `pubkey`.

    False for a bad signature or a pubkey that is not on the curve.
    coincurve releases the GIL, so callers batch this on worker threads.
    """
    try:
        return _xonly_key(event.pubkey).verify(bytes.fromhex(event.sig), bytes.fromhex(event.id))
    except ValueError:
        return False


@lru_cache(maxsize=16_384)
def _xonly_key(pubkey: str) -> PublicKeyXOnly:
    """The parsed key of a hex pubkey, kept for the authors seen most recently: parsing it (a point
    decompression) took 6% of a worker's CPU during ingest, and most events come from authors seen before.

    Raises:
        ValueError: not hex, or not a point on the curve (never kept).
    """
    return PublicKeyXOnly(bytes.fromhex(pubkey))


def check_signature(event: Event) -> None:
    """Raise `Rejection("invalid", ...)` unless `verify_signature(event)`."""
    if not verify_signature(event):
        raise Rejection("invalid", "bad signature")
