"""NIP-98 HTTP auth, the relay's side (as NIP-86 requires it): pure checks, no I/O.

A client signs a kind-27235 event naming the request: `u` its absolute URL,
`method` its HTTP method, `payload` the SHA-256 (hex) of its body (NIP-86
makes the payload tag mandatory), and sends it base64-encoded as
`Authorization: Nostr <base64>` (the scheme in any case: RFC 9110 section
11.1).  Two `u`, `method` or `payload` tags that disagree name no one
request and are refused.  Who may call, and that an event is used
only once, are the server's to decide (relay/server/management.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from urllib.parse import urlsplit

import orjson

from relay.protocol.auth import relay_url_key
from relay.protocol.event import Event, EventLimits, parse_event, verify_signature
from relay.protocol.rejection import Rejection, invalid

HTTP_AUTH_KIND = 27235
SCHEME = "Nostr"


def check_http_auth(authorization: str, url: str, method: str, body: bytes, now: float, max_age_seconds: int,
                    limits: EventLimits, query: str = "") -> Event:
    """The validated kind-27235 event of an `Authorization: Nostr <base64 event>` header (NIP-98).

    `url` is this relay's URL: the `u` tag must name it, in either scheme
    (ws(s):// as NIP-86 says, http(s):// as NIP-98 says; see `relay_url_key`);
    `method` the request's, which the `method` tag must equal exactly (RFC
    9110: methods are case-sensitive); `body` the request's bytes, whose
    SHA-256 the `payload` tag must give; `created_at` within `max_age_seconds` of `now`
    (unix seconds); `query` the request target's query string, which the `u`
    tag must carry exactly (NIP-98: "absolute URL including query
    parameters"), with no user name and no fragment.

    Raises:
        Rejection: "auth-required:" without a Nostr authorization, "invalid:"
        for anything wrong with the event (shape, kind, time, tags, signature).
    """
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != SCHEME.lower() or not encoded.strip():  # RFC 9110 section 11.1: case-insensitive
        raise Rejection("auth-required", "NIP-98: send Authorization: Nostr <base64 kind-27235 event>")
    try:
        obj = orjson.loads(base64.b64decode(encoded.strip(), validate=True))
    except (binascii.Error, ValueError):
        raise invalid("NIP-98: the authorization is not a base64-encoded JSON event") from None
    event = parse_event(obj, limits, now)
    if event.kind != HTTP_AUTH_KIND:
        raise invalid(f"NIP-98: the auth event must be of kind {HTTP_AUTH_KIND}")
    if abs(event.created_at - now) > max_age_seconds:
        raise invalid(f"NIP-98: the auth event's created_at is more than {max_age_seconds} seconds from now")
    named = _one_value(event, "u")
    if named is None or not _names(named, url, query):
        raise invalid(f"NIP-98: the u tag does not name this request ({url}{'?' + query if query else ''})")
    if _one_value(event, "method") != method:  # RFC 9110 section 9.1: methods are case-sensitive
        raise invalid(f"NIP-98: the method tag does not name {method}")
    if _one_value(event, "payload") != hashlib.sha256(body).hexdigest():
        raise invalid("NIP-98: the payload tag is not the SHA-256 of this request's body")
    if not verify_signature(event):
        raise invalid("bad signature")
    return event


def _one_value(event: Event, name: str) -> str | None:
    """The value of `event`'s `name` tags (None without one); raises Rejection "invalid:" when two disagree."""
    values = set(event.tag_values(name))
    if len(values) > 1:
        raise invalid(f"NIP-98: the auth event has {name} tags that disagree")
    return next(iter(values), None)


def _names(u: str, url: str, query: str) -> bool:
    """True when the `u` tag `u` names the relay at `url` (see `relay_url_key`) and the request's `query`."""
    key = relay_url_key(u)
    if key is None or key != relay_url_key(url):
        return False
    parts = urlsplit(u.strip())
    return "@" not in parts.netloc and not parts.fragment and parts.query == query
