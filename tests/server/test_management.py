"""NIP-86 management API on the relay's port, authorized by NIP-98, against a real relay and real clients.

The auth events are built and signed by nostr-sdk (tests/server/nip86.py); clients publish over WebSocket.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed

from relay.commands.projectors import run_verify
from relay.config import ConfigError
from tests.conftest import make_config
from tests.helpers import Client, Keys, eventually
from tests.inprocess import Relay
from tests.server.test_auth import authenticate
from tests.server.nip86 import (
    CONTENT_TYPE,
    PUBLIC_URL,
    admin_config,
    admin_keys,
    authorization,
    call,
    post,
    result,
)


async def started(tmp_path, **sections) -> Relay:
    """A relay managed by `admin_keys()`, with `sections` on top."""
    config = admin_config()
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    relay = Relay(make_config(tmp_path, **config))
    await relay.start()
    return relay


@pytest.fixture
async def managed(tmp_path):
    relay = await started(tmp_path)
    yield relay
    await relay.stop()


async def stored_ids(url: str, *filters: dict) -> set[str]:
    client = await Client.connect(url)
    try:
        return {e["id"] for e in await client.req("q", *(filters or ({},)))}
    finally:
        await client.close()


async def test_banevent_removes_the_event_and_a_republish_on_another_connection_is_blocked(managed, alice):
    """banevent: gone from REQ at once, its republication refused "blocked:" on a connection opened before the
    ban, listed by listbannedevents; allowevent lifts the ban; relay verify stays clean."""
    other = await Client.connect(managed.url)
    event = alice.sign(content="spam", tags=[["t", "x"]])
    assert (await other.publish(event))[2] is True
    assert await result(managed.port, "banevent", event["id"], "spam") is True
    assert await stored_ids(managed.url) == set()
    ok = await other.publish(event)
    assert ok[2] is False and ok[3].startswith("blocked: ")
    assert await result(managed.port, "listbannedevents") == [{"id": event["id"], "reason": "spam"}]
    assert await result(managed.port, "allowevent", event["id"]) is True
    assert await result(managed.port, "listbannedevents") == []
    assert (await other.publish(event))[2] is True
    await other.close()
    assert run_verify(managed.config) == 0


async def test_banpubkey_refuses_the_next_event_on_every_connection_and_purges_when_asked(tmp_path, alice, bob):
    """banpubkey: the author's next EVENT on an open connection gets "blocked:"; with purge_on_ban its
    stored events go in batches (the other author's stay); unbanpubkey lets it publish again."""
    relay = await started(tmp_path, admin={"purge_on_ban": True, "purge_batch_size": 2})
    try:
        client = await Client.connect(relay.url)
        mine = [alice.sign(content=f"a{i}", created_at=1_700_000_000 + i) for i in range(5)]
        theirs = bob.sign(content="b")
        for e in mine + [theirs]:
            assert (await client.publish(e))[2] is True
        assert await result(relay.port, "banpubkey", alice.pubkey, "spammer") is True
        ok = await client.publish(alice.sign(content="after"))
        assert ok[2] is False and ok[3].startswith("blocked: ")

        async def purged() -> bool:
            return await stored_ids(relay.url) == {theirs["id"]}

        assert await eventually(purged)
        assert await result(relay.port, "listbannedpubkeys") == [{"pubkey": alice.pubkey, "reason": "spammer"}]
        assert await result(relay.port, "unbanpubkey", alice.pubkey) is True
        assert (await client.publish(alice.sign(content="back")))[2] is True
        await client.close()
    finally:
        await relay.stop()
    assert run_verify(relay.config) == 0


def _body(method: str = "supportedmethods", params: list | None = None) -> bytes:
    return json.dumps({"method": method, "params": params or []}).encode()


async def _post(relay: Relay, body: bytes, **headers) -> tuple[int, dict]:
    return await asyncio.to_thread(post, relay.port, body, {"Content-Type": CONTENT_TYPE, **headers})


async def test_wrong_or_missing_auth_gets_401_with_a_json_error(managed):
    """No header, another scheme, not base64, not JSON, another kind, URL, method or body, expired, signed by a
    non-admin: 401 with an "error"; nothing is changed."""
    body = _body("banpubkey", ["ab" * 32])
    stranger = admin_keys(0x5742)
    cases = {
        "missing": {},
        "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
        "not base64": {"Authorization": "Nostr ***"},
        "not json": {"Authorization": "Nostr " + base64.b64encode(b"{nope").decode()},
        "kind": {"Authorization": authorization(body, kind=27236)},
        "url": {"Authorization": authorization(body, url="wss://other.example")},
        "method": {"Authorization": authorization(body, method="GET")},
        "payload": {"Authorization": authorization(_body("banpubkey", ["cd" * 32]))},
        "expired": {"Authorization": authorization(body, created_at=int(time.time()) - 120)},
        "future": {"Authorization": authorization(body, created_at=int(time.time()) + 120)},
        "non-admin": {"Authorization": authorization(body, stranger)},
    }
    for name, headers in cases.items():
        status, answer = await _post(managed, body, **headers)
        assert status == 401 and answer["error"].split(":")[0] in ("auth-required", "invalid", "restricted"), name
    assert await result(managed.port, "listbannedpubkeys") == []


async def test_an_auth_event_is_accepted_once(managed):
    """The same Authorization sent twice: 200, then 401 (no replay within its window) saying what to do; the
    same event signed again (the same id, another BIP-340 signature): 200."""
    body, now = _body(), int(time.time())
    headers = {"Authorization": authorization(body, created_at=now)}
    assert (await _post(managed, body, **headers))[0] == 200
    status, answer = await _post(managed, body, **headers)
    assert status == 401 and answer["error"] == "invalid: NIP-98: this auth event was used already; sign a new one"
    assert (await _post(managed, body, Authorization=authorization(body, created_at=now)))[0] == 200


async def test_the_scheme_in_any_case_authorizes_and_an_inexact_or_ambiguous_event_does_not(managed):
    """`nostr` and `NOSTR` authorize as `Nostr` does (RFC 9110 section 11.1); a `post` method tag, and a second
    u, method or payload tag that disagrees with the first, get 401 saying why."""
    body, now = _body(), int(time.time())
    for i, scheme in enumerate(("nostr", "NOSTR")):
        signed = authorization(body, created_at=now - i).removeprefix("Nostr")
        assert (await _post(managed, body, Authorization=scheme + signed))[0] == 200, scheme
    refused = {
        "invalid: NIP-98: the method tag does not name POST": authorization(body, method="post"),
        "invalid: NIP-98: the auth event has u tags that disagree":
            authorization(body, extra_tags=[["u", "wss://other.example"]]),
        "invalid: NIP-98: the auth event has method tags that disagree":
            authorization(body, extra_tags=[["method", "GET"]]),
        "invalid: NIP-98: the auth event has payload tags that disagree":
            authorization(body, extra_tags=[["payload", "00" * 32]]),
    }
    for error, auth in refused.items():
        assert await _post(managed, body, Authorization=auth) == (401, {"error": error})


async def test_the_u_tag_may_name_the_relay_in_either_scheme(managed):
    """NIP-86 says ws(s)://, NIP-98 http(s)://: both name the relay (as the NIP-42 relay tag is compared)."""
    for url in (PUBLIC_URL, PUBLIC_URL.replace("wss://", "https://") + "/"):
        body = _body()
        assert (await _post(managed, body, Authorization=authorization(body, url=url)))[0] == 200


async def test_bad_requests_get_200_with_an_error(managed):
    """Wrong content type: 415; malformed JSON, no method, params not an array, an unknown method, bad params:
    200 with an "error" carrying a NIP-01 prefix."""
    body = _body()
    status, answer = await asyncio.to_thread(post, managed.port, body, {"Content-Type": "application/json",
                                                                        "Authorization": authorization(body)})
    assert status == 415 and answer["error"].startswith("invalid: ")
    for raw in (b"{not json", b"[]", b'{"params": []}', b'{"method": "banpubkey", "params": {}}',
                _body("nosuchmethod"), _body("banpubkey", ["XYZ"]), _body("banpubkey", []),
                _body("allowkind", [-1]), _body("allowkind", ["1"]), _body("blockip", ["300.1.1.1"]), _body("blockip", [1]),
                _body("changerelayname", [7])):
        status, answer = await _post(managed, raw, Authorization=authorization(raw))
        assert status == 200 and answer["error"].startswith("invalid: "), (raw, answer)
    raw = b'{"method": "allowkind", "params": [1e400]}'  # JSON, but past a double: reason and place named
    status, answer = await _post(managed, raw, Authorization=authorization(raw))
    assert status == 200 and "infinity" in answer["error"] and "column 36" in answer["error"], answer


async def test_supportedmethods_lists_every_method_and_nip11_lists_86(managed):
    """supportedmethods names NIP-86's methods and ours; NIP-11 lists 86 (the relay has admins)."""
    methods = await result(managed.port, "supportedmethods")
    for name in ("supportedmethods", "banpubkey", "unbanpubkey", "listbannedpubkeys", "allowpubkey",
                 "unallowpubkey", "listallowedpubkeys", "banevent", "allowevent", "listbannedevents",
                 "listeventsneedingmoderation", "allowkind", "disallowkind", "listallowedkinds", "blockip",
                 "unblockip", "listblockedips", "changerelayname", "changerelaydescription", "changerelayicon",
                 "trustpubkey", "untrustpubkey", "listtrustedpubkeys"):
        assert name in methods
    assert 86 in (await _nip11(managed))["supported_nips"]


async def _nip11(relay: Relay) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{relay.port}/", headers={"Accept": "application/nostr+json"})
    return json.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=5).read()))


async def test_nip11_leaves_out_86_without_admins(relay):
    """Without [admin] pubkeys, NIP-11 does not list 86 and no route takes a management call (websockets,
    which gets it, refuses a plain request with a body)."""
    assert 86 not in (await _nip11(relay))["supported_nips"]
    body = _body()
    request = urllib.request.Request(f"http://127.0.0.1:{relay.port}/", data=body, method="POST", headers={
        "Content-Type": CONTENT_TYPE, "Authorization": authorization(body)})
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)


async def test_name_description_and_icon_override_info_until_set_back(managed):
    """changerelayname/description/icon win over [info] in NIP-11; "" sets each back."""
    for method, value in (("changerelayname", "Moderated"), ("changerelaydescription", "new words"),
                          ("changerelayicon", "https://relay.example/icon.png")):
        assert await result(managed.port, method, value) is True
    doc = await _nip11(managed)
    assert (doc["name"], doc["description"], doc["icon"]) == ("Moderated", "new words",
                                                               "https://relay.example/icon.png")
    for method in ("changerelayname", "changerelaydescription", "changerelayicon"):
        await result(managed.port, method, "")
    doc = await _nip11(managed)
    assert (doc["name"], doc["description"], "icon" in doc) == (managed.config.info.name,
                                                                managed.config.info.description, False)


@pytest.mark.parametrize("icon", ["javascript:alert(1)", "data:image/png;base64,AAAA", "https:///no-host",
                                  "http://[::1", "relay.example/icon.png", "ftp://relay.example/icon.png"])
async def test_an_icon_that_is_not_an_http_url_is_refused(managed, icon):
    """changerelayicon takes an http(s) URL with a host or "" only (`javascript:alert(1)` was served as NIP-11's
    `icon`): anything else is `invalid:` and NIP-11 keeps its icon."""
    assert await result(managed.port, "changerelayicon", "HTTPS://relay.example/icon.png") is True
    status, answer = await call(managed.port, "changerelayicon", icon)
    assert status == 200 and answer["error"].startswith('invalid: params[0] must be an http(s) URL or ""')
    assert (await _nip11(managed))["icon"] == "HTTPS://relay.example/icon.png"


async def test_kinds_of_config_and_database_combine_and_a_deny_wins(tmp_path, alice):
    """[auth] allow_kinds = [1] plus allowkind 7 make the allow list; disallowkind 1 denies kind 1 although the
    config allows it; listallowedkinds and listdisallowedkinds give the effective lists."""
    relay = await started(tmp_path, auth={"allow_kinds": [1]})
    try:
        client = await Client.connect(relay.url)
        assert (await client.publish(alice.sign(kind=7, content="+")))[3].startswith("blocked: ")
        await result(relay.port, "allowkind", 7)
        assert (await client.publish(alice.sign(kind=7, content="+")))[2] is True
        await result(relay.port, "disallowkind", 1)
        assert (await client.publish(alice.sign(kind=1, content="x")))[3].startswith("blocked: ")
        assert await result(relay.port, "listallowedkinds") == [1, 7]
        assert await result(relay.port, "listdisallowedkinds") == [1]
        await client.close()
    finally:
        await relay.stop()


async def test_allowkind_and_disallowkind_undo_each_other_back_to_every_kind(managed, alice):
    """allowkind 1 -> only kind 1; disallowkind 1 only takes it off the allow list -> every kind again;
    disallowkind 1 -> kind 1 denied; allowkind 1 only lifts that -> every kind again (both lists empty)."""
    client = await Client.connect(managed.url)

    async def accepted(kind: int) -> bool:
        return (await client.publish(alice.sign(kind=kind, content=f"{kind} {time.monotonic()}")))[2]

    async def lists() -> tuple[list, list]:
        return await result(managed.port, "listallowedkinds"), await result(managed.port, "listdisallowedkinds")

    steps = (("allowkind", ([1], []), {1: True, 7: False}), ("disallowkind", ([], []), {1: True, 7: True}),
             ("disallowkind", ([], [1]), {1: False, 7: True}), ("allowkind", ([], []), {1: True, 7: True}))
    for method, listed, outcomes in steps:
        assert await result(managed.port, method, 1) is True
        assert await lists() == listed, method
        assert {kind: await accepted(kind) for kind in outcomes} == outcomes, method
    await client.close()


async def test_allowpubkey_lets_an_author_publish_when_writes_are_listed(tmp_path, alice, bob):
    """[auth] write = listed with only alice listed: bob is refused until allowpubkey, again after unallowpubkey;
    banpubkey takes a pubkey off the allow list (NIP-86); listallowedpubkeys gives the config's and the
    database's."""
    relay = await started(tmp_path, auth={"write": "listed", "write_pubkeys": [alice.pubkey]})
    try:
        client = await Client.connect(relay.url)
        assert (await client.publish(bob.sign(content="1")))[2] is False
        await result(relay.port, "allowpubkey", bob.pubkey, "friend")
        assert (await client.publish(bob.sign(content="2")))[2] is True
        listed = {"pubkey": alice.pubkey, "reason": "config: [auth] write_pubkeys"}
        assert await result(relay.port, "listallowedpubkeys") == [listed, {"pubkey": bob.pubkey, "reason": "friend"}]
        await result(relay.port, "banpubkey", bob.pubkey)
        assert await result(relay.port, "listallowedpubkeys") == [listed]
        await result(relay.port, "unbanpubkey", bob.pubkey)
        assert (await client.publish(bob.sign(content="3")))[2] is False
        assert (await client.publish(alice.sign(content="4")))[2] is True
        await client.close()
    finally:
        await relay.stop()


async def test_blockip_closes_open_connections_at_their_next_message_and_refuses_new_ones(managed, alice):
    """blockip 127.0.0.1: an open connection is closed (1008 "blocked:") at its next message, a new one at
    once; unblockip lets it in again; listblockedips lists it."""
    client = await Client.connect(managed.url)
    await result(managed.port, "blockip", "127.0.0.1", "abuse")
    assert await result(managed.port, "listblockedips") == [{"ip": "127.0.0.1/32", "reason": "abuse"}]
    with pytest.raises(ConnectionClosed) as closed:
        await client.publish(alice.sign(content="x"))
        await client.recv()
    assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason.startswith("blocked: ")
    fresh = await Client.connect(managed.url)
    with pytest.raises(ConnectionClosed):
        await fresh.recv()
    await result(managed.port, "unblockip", "127.0.0.1")
    again = await Client.connect(managed.url)
    assert (await again.publish(alice.sign(content="y")))[2] is True
    await again.close()


async def test_events_needing_moderation_are_those_reported_by_id(managed, alice, bob):
    """A NIP-56 report naming an event (`e`) lists it with its report type; a report naming only a pubkey lists
    nothing; allowevent and banevent take it off the list."""
    client = await Client.connect(managed.url)
    bad, also = alice.sign(content="bad"), alice.sign(content="also")
    for e in (bad, also, bob.sign(kind=1984, tags=[["e", bad["id"], "spam"], ["p", alice.pubkey]]),
              bob.sign(kind=1984, tags=[["e", also["id"]]]), bob.sign(kind=1984, tags=[["p", alice.pubkey, "spam"]])):
        assert (await client.publish(e))[2] is True
    await client.close()
    listed = await result(managed.port, "listeventsneedingmoderation")
    assert sorted(listed, key=lambda x: x["id"]) == sorted([{"id": bad["id"], "reason": "spam"},
                                                            {"id": also["id"], "reason": "reported"}],
                                                           key=lambda x: x["id"])
    await result(managed.port, "allowevent", bad["id"])
    await result(managed.port, "banevent", also["id"])
    assert await result(managed.port, "listeventsneedingmoderation") == []


async def test_a_browser_preflight_is_answered(managed):
    """OPTIONS / with Access-Control-Request-Method POST and headers Authorization, Content-Type: answered 2xx
    allowing them (the generic preflight of the HTTP layer)."""
    request = urllib.request.Request(f"http://127.0.0.1:{managed.port}/", method="OPTIONS", headers={
        "Origin": "https://admin.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    response = await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
    assert response.status in (200, 204)
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    allowed = response.headers["Access-Control-Allow-Headers"].lower()
    assert allowed == "*" or {"authorization", "content-type"} <= {h.strip() for h in allowed.split(",")}


async def test_a_trusted_pubkey_is_not_rate_limited_once_authenticated(tmp_path, alice, bob):
    """With two EVENTs (AUTH included) per connection allowed: a connection authenticated as a pubkey trusted by NIP-86
    trustpubkey (or [rate_limits] trusted_pubkeys) publishes on; an untrusted one is limited."""
    relay = await started(tmp_path, rate_limits={"exempt": [], "exempt_loopback": False,
                                                 "events_per_second": 0.01, "events_burst": 2,
                                                 "trusted_pubkeys": [bob.pubkey]})
    try:
        await result(relay.port, "trustpubkey", alice.pubkey)
        assert await result(relay.port, "listtrustedpubkeys") == [
            {"pubkey": bob.pubkey, "reason": "config: [rate_limits] trusted_pubkeys"},
            {"pubkey": alice.pubkey, "reason": ""}]
        for keys, trusted in ((alice, True), (bob, True), (Keys(0xC0FFEE), False)):
            client = await Client.connect(relay.url)
            await _authenticate(client, keys)  # (the AUTH took one of the two tokens)
            oks = [await client.publish(keys.sign(content=str(i))) for i in range(3)]
            assert [ok[2] for ok in oks] == [True, trusted, trusted], keys.pubkey
            await client.close()
    finally:
        await relay.stop()


async def _authenticate(client: Client, keys: Keys) -> None:
    """Answer the connection's NIP-42 challenge (sent on connect) as `keys`."""
    challenge = json.loads(await asyncio.wait_for(client.ws.recv(), 5))
    assert challenge[0] == "AUTH"
    client.challenge = challenge[1]
    assert (await authenticate(client, keys, PUBLIC_URL))[2] is True


def test_admins_need_a_public_url(tmp_path):
    """[admin] pubkeys without [server] public_url (what NIP-98 u tags must name) stops the start."""
    with pytest.raises(ConfigError, match="server.public_url: must be set when admin.pubkeys is"):
        make_config(tmp_path, admin={"pubkeys": [admin_keys().public_key().to_hex()]})
