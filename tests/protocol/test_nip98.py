"""NIP-98 HTTP auth checks (pure): auth events signed by hand with coincurve (tests.helpers.Keys)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from relay.protocol.event import EventLimits
from relay.protocol.nip98 import check_http_auth
from relay.protocol.rejection import Rejection
from tests.helpers import Keys

URL = "wss://relay.example/"
BODY = b'{"method":"supportedmethods","params":[]}'
NOW = 1_750_000_000
PAYLOAD = hashlib.sha256(BODY).hexdigest()


def header(keys: Keys, tags: list | None = None, kind: int = 27235, created_at: int = NOW) -> str:
    tags = [["u", URL], ["method", "POST"], ["payload", PAYLOAD]] if tags is None else tags
    event = keys.sign(kind=kind, tags=tags, created_at=created_at)
    return "Nostr " + base64.b64encode(json.dumps(event).encode()).decode()


def check(authorization: str, url: str = URL, method: str = "POST", body: bytes = BODY):
    return check_http_auth(authorization, url, method, body, NOW, 60, EventLimits())


def test_a_valid_auth_event_names_its_signer(alice):
    """The u tag in either scheme, with or without a trailing slash."""
    assert check(header(alice)).pubkey == alice.pubkey
    assert check(header(alice), url="https://relay.example").pubkey == alice.pubkey


@pytest.mark.parametrize("scheme", ["Nostr", "nostr", "NOSTR", "nOsTr"])
def test_the_scheme_is_case_insensitive(alice, scheme):
    """RFC 9110 section 11.1: an auth scheme is matched in any case."""
    assert check(scheme + header(alice).removeprefix("Nostr")).pubkey == alice.pubkey


@pytest.mark.parametrize("tag_method, request_method", [("post", "POST"), ("POST", "post"), ("Post", "POST")])
def test_the_method_tag_must_equal_the_request_method_exactly(alice, tag_method, request_method):
    """RFC 9110 section 9.1: a method is case-sensitive, so `post` does not name a POST."""
    authorization = header(alice, [["u", URL], ["method", tag_method], ["payload", PAYLOAD]])
    with pytest.raises(Rejection) as refused:
        check(authorization, method=request_method)
    assert str(refused.value) == f"invalid: NIP-98: the method tag does not name {request_method}"


@pytest.mark.parametrize("tags, name", [
    ([["u", URL], ["u", "wss://other.example/"], ["method", "POST"], ["payload", PAYLOAD]], "u"),
    ([["u", "wss://other.example/"], ["u", URL], ["method", "POST"], ["payload", PAYLOAD]], "u"),
    ([["u", URL], ["method", "POST"], ["method", "GET"], ["payload", PAYLOAD]], "method"),
    ([["u", URL], ["method", "POST"], ["method", "post"], ["payload", PAYLOAD]], "method"),
    ([["u", URL], ["method", "POST"], ["payload", PAYLOAD], ["payload", hashlib.sha256(b"x").hexdigest()]],
     "payload"),
])
def test_disagreeing_duplicate_tags_are_refused(alice, tags, name):
    """Two u, method or payload tags with different values: refused whichever comes first, since the request
    can only be one of them."""
    with pytest.raises(Rejection) as refused:
        check(header(alice, tags))
    assert str(refused.value) == f"invalid: NIP-98: the auth event has {name} tags that disagree"


def test_identical_duplicate_tags_are_accepted(alice):
    """A u, method or payload tag repeated with the same value names the same request."""
    tags = [["u", URL], ["method", "POST"], ["payload", PAYLOAD]]
    assert check(header(alice, tags + tags)).pubkey == alice.pubkey


@pytest.mark.parametrize("u", ["wss://evil@relay.example/", "wss://relay.example/?a=1", "wss://relay.example/#x"])
def test_a_u_tag_with_a_user_name_query_or_fragment_the_request_lacks_is_refused(alice, u):
    """NIP-98's u is the request's absolute URL, query included: a user name, a query the request does not
    carry or a fragment names another request."""
    authorization = header(alice, [["u", u], ["method", "POST"], ["payload", hashlib.sha256(BODY).hexdigest()]])
    with pytest.raises(Rejection) as refused:
        check(authorization)
    assert str(refused.value).startswith("invalid: NIP-98: the u tag does not name this request")


def test_a_u_tag_carries_the_requests_query(alice):
    """A request to URL?a=1 is authorized by a u tag naming URL?a=1, and only by it."""
    tags = [["u", URL + "?a=1"], ["method", "POST"], ["payload", hashlib.sha256(BODY).hexdigest()]]
    assert check_http_auth(header(alice, tags), URL, "POST", BODY, NOW, 60, EventLimits(), "a=1").pubkey == alice.pubkey
    with pytest.raises(Rejection):
        check_http_auth(header(alice, tags), URL, "POST", BODY, NOW, 60, EventLimits(), "a=2")


@pytest.mark.parametrize("make, says", [
    (lambda k: "", "auth-required: "),
    (lambda k: "Bearer abc", "auth-required: "),
    (lambda k: "Nostr %%%", "invalid: NIP-98: the authorization is not"),
    (lambda k: "Nostr " + base64.b64encode(b"[1,2]").decode(), "invalid: "),
    (lambda k: header(k, kind=1), "invalid: NIP-98: the auth event must be of kind 27235"),
    (lambda k: header(k, created_at=NOW - 61), "invalid: NIP-98: the auth event's created_at"),
    (lambda k: header(k, [["u", "wss://other.example"], ["method", "POST"],
                          ["payload", hashlib.sha256(BODY).hexdigest()]]), "invalid: NIP-98: the u tag"),
    (lambda k: header(k, [["method", "POST"], ["payload", hashlib.sha256(BODY).hexdigest()]]),
     "invalid: NIP-98: the u tag"),
    (lambda k: header(k, [["u", URL], ["method", "GET"], ["payload", hashlib.sha256(BODY).hexdigest()]]),
     "invalid: NIP-98: the method tag"),
    (lambda k: header(k, [["u", URL], ["method", "POST"]]), "invalid: NIP-98: the payload tag"),
    (lambda k: header(k, [["u", URL], ["method", "POST"], ["payload", hashlib.sha256(b"other").hexdigest()]]),
     "invalid: NIP-98: the payload tag"),
])
def test_a_wrong_authorization_is_refused_with_a_prefix(alice, make, says):
    """Each wrong part is named, with a NIP-01 / NIP-42 prefix."""
    with pytest.raises(Rejection) as refused:
        check(make(alice))
    assert str(refused.value).startswith(says)


def test_a_bad_signature_is_refused(alice, bob):
    """An event whose sig belongs to another key: "invalid: bad signature"."""
    event = alice.sign(kind=27235, tags=[["u", URL], ["method", "POST"],
                                         ["payload", hashlib.sha256(BODY).hexdigest()]], created_at=NOW)
    event["sig"] = bob.sign(kind=27235, created_at=NOW)["sig"]
    with pytest.raises(Rejection, match="bad signature"):
        check("Nostr " + base64.b64encode(json.dumps(event).encode()).decode())
