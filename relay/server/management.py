"""NIP-86 relay management API on the relay's port: JSON-RPC over HTTP POST, authorized by NIP-98.

How this works: `ManagementApi.handle` answers a POST whose Content-Type is
`application/nostr+json+rpc` (else 415).  Its `Authorization` must hold a
NIP-98 event (relay/protocol/nip98.py) naming `[server] public_url`, POST
and this body's SHA-256, signed by a pubkey of `[admin] pubkeys` (every
method) or one granted the method called (relay/server/roles.py), not used
before (else 401 with a JSON `error`).  The body is `{"method": ...,
"params": [...]}`; the answer `{"result": ...}`, or `{"error": "<NIP-01
prefix>: ..."}` with status 200 for an unknown method or bad params.  Each
method changes the moderation lists (relay/ingest/moderation.py), which
apply to the next message on every connection once the answer is sent.
`METHODS` lists them: NIP-86's, and ours (`trustpubkey`, `untrustpubkey`,
`listtrustedpubkeys`: connections authenticated as a trusted pubkey are not
rate limited; `listroles`, `assignrolemethod`, `unassignrolemethod`: roles
carry grants).  Roles and grants are in the database (relay/store/roles.py).
The lists answer the effective rules: the configuration's kinds, writers
and trusted pubkeys with the database's.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

import orjson
import structlog

from relay.config import Config
from relay.ingest.moderation import Moderation, admin_ban_refusal
from relay.protocol.event import MAX_KIND, EventLimits
from relay.protocol.nip98 import check_http_auth
from relay.protocol.rejection import Rejection
from relay.server import roles
from relay.server.rpc import Method, MethodError, hex64, param, pubkey
from relay.wire.http import HttpRequest, HttpResponse, route_path
from relay.store import auth_claims
from relay.store import moderation as lists
from relay.store.store import JobFailed, StoreFailed

log = structlog.get_logger(__name__)

CONTENT_TYPE = "application/nostr+json+rpc"
"""NIP-86: the media type of a management request and of its answer."""
MAX_REPORTED = 1000
"""Events `listeventsneedingmoderation` returns at most."""


def _json(status: HTTPStatus, body: dict) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(body), CONTENT_TYPE)


MAX_REASON = 1000
"""Characters a ban's (or a kind rule's) reason may have at most: lists show it to every admin."""
WIDEST_BLOCK = {4: 8, 6: 32}
"""The shortest prefix length of a network that may be blocked, by IP version: a wider network would shut out
much of the internet, the admins with it (0.0.0.0/0: everyone)."""


def block_refusal(network: str, admin: bool) -> str | None:
    """Why `network` (an IP address or network, as `ipaddress` writes it) may not be blocked by an admin
    (`admin`) or by a pubkey granted blockip, or None when it may."""
    net = ipaddress.ip_network(network)
    widest = WIDEST_BLOCK[net.version]
    if net.prefixlen < widest:
        return f"{net} is wider than /{widest}: block networks of /{widest} or narrower"
    if not admin and net.num_addresses > 1:
        return f"only the relay's admins block networks: block single addresses (/{net.max_prefixlen})"
    return None


def _reason(params: list) -> str:
    return param(params, 1, f"a string of at most {MAX_REASON} characters (the reason)",
                 lambda v: type(v) is str and len(v) <= MAX_REASON, default="")


def _kind(params: list) -> int:
    return param(params, 0, f"a kind from 0 to {MAX_KIND}", lambda v: type(v) is int and 0 <= v <= MAX_KIND)


def _is_ip(value: object) -> bool:
    if type(value) is not str:  # (ipaddress takes integers too)
        return False
    try:
        ipaddress.ip_network(value, strict=False)
    except (TypeError, ValueError):
        return False
    return True


def _ip(params: list) -> str:
    return str(ipaddress.ip_network(param(params, 0, "an IP address or network", _is_ip), strict=False))


def _text(params: list) -> str:
    return param(params, 0, "a string", lambda v: type(v) is str and len(v) <= 4096)


async def _add(name: str, parse: Callable[[list], str], drop: tuple[str, ...], moderation: Moderation,
               params: list) -> bool:
    await moderation.add(name, parse(params), _reason(params), drop)
    return True


async def _remove(names: tuple[str, ...], parse: Callable[[list], str], moderation: Moderation,
                  params: list) -> bool:
    await moderation.remove(names, parse(params))
    return True


def _event_id(params: list) -> str:
    return hex64(params, "event id")


async def _ban_pubkey(moderation: Moderation, params: list) -> bool:
    await moderation.ban_pubkey(pubkey(params), _reason(params))
    return True


async def _ban_event(moderation: Moderation, params: list) -> bool:
    await moderation.ban_event(_event_id(params), _reason(params))
    return True


async def _needing_moderation(moderation: Moderation, params: list) -> list[dict]:
    return [{"id": id_, "reason": reason} for id_, reason in await moderation.reported(MAX_REPORTED)]


def _is_icon(value: object) -> bool:
    """Whether `value` may be the relay's NIP-11 icon: "" (back to none), or an http(s) URL with a host (a
    client shows it: no `javascript:` or `data:`), at most 4096 characters."""
    if type(value) is not str or len(value) > 4096:
        return False
    try:
        url = urlsplit(value)
        return value == "" or (url.scheme.lower() in ("http", "https") and bool(url.hostname))
    except ValueError:  # e.g. an unclosed IPv6 host
        return False


def _icon(params: list) -> str:
    return param(params, 0, 'an http(s) URL or ""', _is_icon)


def _info(field: str, parse: Callable[[list], str] = _text) -> Method:
    async def change(moderation: Moderation, params: list) -> bool:
        value = parse(params)
        if value:
            await moderation.add(lists.INFO, field, value)
        else:  # "" sets it back to [info]'s
            await moderation.remove((lists.INFO,), field)
        return True
    return change


def _lister(name: str, key: str) -> Method:
    async def listed(moderation: Moderation, params: list) -> list[dict]:
        return [{key: e.item, "reason": e.reason} for e in moderation.effective(name)]
    return listed


def _set_kind(allow: bool) -> Method:
    async def change(moderation: Moderation, params: list) -> bool:
        await moderation.set_kind(_kind(params), allow, _reason(params))
        return True
    return change


def _kinds(allowed: bool) -> Method:
    async def listed(moderation: Moderation, params: list) -> list[int]:
        rules = moderation.kinds
        return sorted(rules.allow or ()) if allowed else sorted(rules.deny)
    return listed


def _method(fn: Callable, *args) -> Method:
    return lambda moderation, params: fn(*args, moderation, params)


METHODS: dict[str, Method] = {
    "banpubkey": _ban_pubkey,
    "unbanpubkey": _method(_remove, (lists.BANNED_PUBKEY, lists.PURGE_PUBKEY), pubkey),
    "listbannedpubkeys": _lister(lists.BANNED_PUBKEY, "pubkey"),
    "allowpubkey": _method(_add, lists.ALLOWED_PUBKEY, pubkey, (lists.BANNED_PUBKEY, lists.PURGE_PUBKEY)),
    "unallowpubkey": _method(_remove, (lists.ALLOWED_PUBKEY,), pubkey),
    "listallowedpubkeys": _lister(lists.ALLOWED_PUBKEY, "pubkey"),
    "listeventsneedingmoderation": _needing_moderation,
    "allowevent": _method(_add, lists.ALLOWED_EVENT, _event_id, (lists.BANNED_EVENT,)),
    "unallowevent": _method(_remove, (lists.ALLOWED_EVENT,), _event_id),
    "banevent": _ban_event,
    "unbanevent": _method(_remove, (lists.BANNED_EVENT,), _event_id),
    "listbannedevents": _lister(lists.BANNED_EVENT, "id"),
    "listallowedevents": _lister(lists.ALLOWED_EVENT, "id"),
    "changerelayname": _info("name"),
    "changerelaydescription": _info("description"),
    "changerelayicon": _info("icon", _icon),
    "allowkind": _set_kind(allow=True),  # off the deny list if on it, else onto the allow list
    "disallowkind": _set_kind(allow=False),  # off the allow list if on it, else onto the deny list
    "listallowedkinds": _kinds(allowed=True),
    "listdisallowedkinds": _kinds(allowed=False),
    "blockip": _method(_add, lists.BLOCKED_IP, _ip, ()),
    "unblockip": _method(_remove, (lists.BLOCKED_IP,), _ip),
    "listblockedips": _lister(lists.BLOCKED_IP, "ip"),
    # ours: a trusted pubkey's connections are not rate limited once authenticated (NIP-42)
    "trustpubkey": _method(_add, lists.TRUSTED_PUBKEY, pubkey, ()),
    "untrustpubkey": _method(_remove, (lists.TRUSTED_PUBKEY,), pubkey),
    "listtrustedpubkeys": _lister(lists.TRUSTED_PUBKEY, "pubkey"),
}
"""Every method but `supportedmethods`, by name: `await METHODS[name](moderation, params)` -> its result.

Raises:
    MethodError: bad params.
"""
METHODS.update(roles.methods(grantable=frozenset(METHODS)))  # admins hand out any of the above


class ManagementApi:
    """The NIP-86 endpoint of one relay: `handle` answers POSTs to `path`, the path of `[server] public_url`
    ("/" without one) (its route: relay/server/app.py)."""

    def __init__(self, config: Config, moderation: Moderation, limits: EventLimits) -> None:
        self.moderation = moderation
        self.admins = frozenset(config.admin.pubkeys)
        self.url = config.server.public_url
        self.path = route_path(self.url) or "/"  # NIP-86: the relay's own URI, as NIP-98's u tag names it
        self.max_age_seconds = config.admin.auth_max_age_seconds
        self.limits = limits

    async def handle(self, request: HttpRequest) -> HttpResponse:
        """Answer one NIP-86 request: 415 for another Content-Type, 401 for bad auth or a method the signer may
        not call, else 200 (see module)."""
        media_type = request.header("content-type").partition(";")[0].strip().lower()
        if media_type != CONTENT_TYPE:
            return _json(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": f"invalid: Content-Type must be {CONTENT_TYPE}"})
        try:
            caller, allowed = await self._authorize(request)
            method, params = _parse(request.body)
            if allowed is not None and method in METHODS and method not in allowed:
                raise Rejection("restricted", f"this pubkey may not call {method}")
            result = await self._call(method, params, allowed)
        except Rejection as rejection:
            log.info("management_unauthorized", reason=str(rejection))
            return _json(HTTPStatus.UNAUTHORIZED, {"error": str(rejection)})
        except MethodError as exc:
            return _json(HTTPStatus.OK, {"result": None, "error": str(exc)})
        except (JobFailed, StoreFailed) as exc:  # the writer refused this change alone, or cannot write at all
            log.error("management_failed", error=str(exc))
            return _json(HTTPStatus.OK, {"result": None, "error": "error: internal"})
        log.info("management_call", method=method, pubkey=caller)
        return _json(HTTPStatus.OK, {"result": result})

    async def _authorize(self, request: HttpRequest) -> tuple[str, frozenset[str] | None]:
        """(the pubkey that signed `request`'s NIP-98 event, the methods it may call: None for an admin's
        every method); the event is then used up."""
        now = time.time()
        event = check_http_auth(request.header("authorization"), self.url, request.method, request.body, now,
                                self.max_age_seconds, self.limits, request.query)
        allowed = None if event.pubkey in self.admins else await roles.permitted(self.moderation, event.pubkey)
        if allowed is not None and not allowed:
            raise Rejection("restricted", "this pubkey is not an admin of this relay and was granted no method")
        # One writer job for every process of the relay (relay/store/auth_claims.py), so no worker takes a replay.
        if not await self.moderation.writer.run_job(auth_claims.claim, event.sig,
                                                   event.created_at + self.max_age_seconds, int(now)):
            raise Rejection("invalid", "NIP-98: this auth event was used already; sign a new one")
        return event.pubkey, allowed

    async def _call(self, method: str, params: list, allowed: frozenset[str] | None) -> object:
        if method == "supportedmethods":  # NIP-86: what this caller may call
            return ["supportedmethods", *(m for m in METHODS if allowed is None or m in allowed)]
        call = METHODS.get(method)
        if call is None:
            raise MethodError(f"invalid: unknown method {method!r:.80}")
        # Checked here, where the caller is known: a grantee could otherwise lock the admins out.
        if method == "banpubkey" and pubkey(params) in self.admins:
            raise MethodError("restricted: " + admin_ban_refusal(pubkey(params)))
        if method == "blockip" and (refusal := block_refusal(_ip(params), admin=allowed is None)) is not None:
            raise MethodError("restricted: " + refusal)
        return await call(self.moderation, params)


def _parse(body: bytes) -> tuple[str, list]:
    """(method, params) of a NIP-86 request body; raises MethodError."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # its reason and place: `1e400` is JSON, but no number a relay keeps
        raise MethodError(f"invalid: the body is not JSON the relay can read: {exc}") from None
    if type(request) is not dict or type(request.get("method")) is not str:
        raise MethodError('invalid: the body must be {"method": "<name>", "params": [...]}')
    params = request.get("params", [])
    if type(params) is not list:
        raise MethodError("invalid: params must be an array")
    return request["method"], params
