"""NIP-86 roles and per-method grants against a real relay: auth events signed by nostr-sdk, a real SQLite file.

Admins (`[admin] pubkeys`) may call every method; another pubkey exactly the methods granted to it or to its
roles, from the request after the grant's 200.
"""

from __future__ import annotations

import pytest

from tests.conftest import make_config
from tests.helpers import Client
from tests.inprocess import Relay
from tests.server.nip86 import admin_config, admin_keys, call, result

MODERATOR = admin_keys(0x30D)
"""nostr-sdk keys of a pubkey that is not an admin."""
MOD = MODERATOR.public_key().to_hex()


@pytest.fixture
async def managed(tmp_path):
    relay = Relay(make_config(tmp_path, **admin_config()))
    await relay.start()
    yield relay
    await relay.stop()


async def as_moderator(relay: Relay, method: str, *params) -> tuple[int, dict]:
    return await call(relay.port, method, *params, keys=MODERATOR)


async def test_a_granted_method_is_callable_at_once_and_no_other(managed, alice):
    """assignmethod banevent: the moderator's next request may ban an event, and gets 401 "restricted:" for
    banpubkey; supportedmethods lists only what it may call; after unassignmethod, banevent gets 401 too."""
    status, answer = await as_moderator(managed, "banevent", "ab" * 32)
    assert status == 401 and answer["error"].startswith("restricted: ")
    assert await result(managed.port, "assignmethod", MOD, "banevent") == [True, "banevent granted"]
    assert await result(managed.port, "assignmethod", MOD, "banevent") == [False, "banevent was already granted"]
    client = await Client.connect(managed.url)
    event = alice.sign(content="spam")
    assert (await client.publish(event))[2] is True
    assert await as_moderator(managed, "banevent", event["id"], "spam") == (200, {"result": True})
    assert (await client.publish(event))[3].startswith("blocked: ")
    await client.close()
    status, answer = await as_moderator(managed, "banpubkey", alice.pubkey)
    assert status == 401 and answer["error"] == "restricted: this pubkey may not call banpubkey"
    assert await as_moderator(managed, "supportedmethods") == (200, {"result": ["supportedmethods", "banevent"]})
    assert await result(managed.port, "listmethodassignees") == [{"pubkey": MOD, "methods": ["banevent"]}]
    assert await result(managed.port, "unassignmethod", MOD, "banevent") == [True, "banevent revoked"]
    assert await result(managed.port, "unassignmethod", MOD, "banevent") == [False, "banevent was not granted"]
    assert (await as_moderator(managed, "listbannedevents"))[0] == 401
    assert await result(managed.port, "listmethodassignees") == []


async def test_a_role_grants_its_methods_to_its_pubkeys(managed, alice):
    """createrole, assignrolemethod, assignrole: the holder may call the role's methods; listroles shows the
    role; editrole changes it; unassignrole and deleterole (which takes its grants and members) take the
    methods away at the next request."""
    assert await result(managed.port, "createrole", "mods", "Moderators", "ban spam", "#ff0000", 2) is True
    assert await result(managed.port, "assignrolemethod", "mods", "banpubkey") == [True, "banpubkey granted"]
    assert (await result(managed.port, "assignrolemethod", "mods", "listbannedpubkeys"))[0] is True
    assert await result(managed.port, "assignrole", MOD, "mods") is True
    assert await as_moderator(managed, "banpubkey", alice.pubkey, "spam") == (200, {"result": True})
    assert (await as_moderator(managed, "listbannedpubkeys"))[1]["result"] == [{"pubkey": alice.pubkey,
                                                                               "reason": "spam"}]
    assert (await as_moderator(managed, "unbanpubkey", alice.pubkey))[0] == 401
    assert await result(managed.port, "listmethodassignees") == [
        {"pubkey": MOD, "methods": ["banpubkey", "listbannedpubkeys"]}]
    assert await result(managed.port, "editrole", "mods", "Mods", "", "", 1) is True
    assert await result(managed.port, "listroles") == [
        {"id": "mods", "label": "Mods", "description": "", "color": "", "order": 1,
         "methods": ["banpubkey", "listbannedpubkeys"], "pubkeys": [MOD]}]
    # fields left out, or null, keep their values
    assert await result(managed.port, "editrole", "mods", None, "ban spammers", None) is True
    assert await result(managed.port, "editrole", "mods") is True
    assert (await result(managed.port, "listroles"))[0] == {
        "id": "mods", "label": "Mods", "description": "ban spammers", "color": "", "order": 1,
        "methods": ["banpubkey", "listbannedpubkeys"], "pubkeys": [MOD]}
    assert await result(managed.port, "unassignrole", MOD, "mods") is True
    assert (await as_moderator(managed, "listbannedpubkeys"))[0] == 401
    await result(managed.port, "assignrole", MOD, "mods")
    assert await result(managed.port, "deleterole", "mods") is True
    assert (await as_moderator(managed, "listbannedpubkeys"))[0] == 401
    assert await result(managed.port, "listroles") == []
    await result(managed.port, "createrole", "mods")  # a new role of the same id starts empty
    assert await result(managed.port, "listroles") == [
        {"id": "mods", "label": "", "description": "", "color": "", "order": 0, "methods": [], "pubkeys": []}]


async def test_only_admins_hand_out_permissions(managed):
    """The role and grant methods cannot be granted ([false, "restricted: ..."]); an admin may call every
    method without any grant."""
    for method in ("assignmethod", "createrole", "listmethodassignees"):
        answer = await result(managed.port, "assignmethod", MOD, method)
        assert answer[0] is False and answer[1].startswith("restricted: "), method
    await result(managed.port, "assignmethod", MOD, "listbannedevents")
    assert (await as_moderator(managed, "assignmethod", MOD, "banpubkey"))[0] == 401
    everything = await result(managed.port, "supportedmethods")
    assert {"createrole", "editrole", "deleterole", "assignrole", "unassignrole", "assignmethod",
            "unassignmethod", "listmethodassignees", "banpubkey"} <= set(everything)


async def test_grants_live_in_the_database(tmp_path):
    """A grant made before a restart still lets its pubkey call the method after it."""
    config = make_config(tmp_path, **admin_config())
    relay = Relay(config)
    await relay.start()
    await result(relay.port, "createrole", "readers")
    await result(relay.port, "assignrolemethod", "readers", "listblockedips")
    await result(relay.port, "assignrole", MOD, "readers")
    await relay.stop()
    relay = Relay(config)
    await relay.start()
    try:
        assert await as_moderator(relay, "listblockedips") == (200, {"result": []})
    finally:
        await relay.stop()


BAD_PARAMS = [
    ("createrole", []), ("createrole", [7]), ("createrole", [""]), ("createrole", ["x" * 65]),
    ("createrole", ["r", 1]), ("createrole", ["r", "", None]), ("createrole", ["r", "", "", ["red"]]),
    ("createrole", ["r", "", "", "", "1"]), ("createrole", ["r", "", "", "", 1.5]),
    ("editrole", []), ("editrole", ["nosuchrole"]), ("editrole", ["r", "", "", "", True]),
    ("deleterole", []), ("deleterole", [{}]),
    ("assignrole", []), ("assignrole", ["XYZ", "r"]), ("assignrole", ["ab" * 32]), ("assignrole", ["ab" * 32, 1]),
    ("assignrole", ["ab" * 32, "nosuchrole"]),
    ("unassignrole", ["ab" * 32]), ("unassignrole", ["AB" * 32, "r"]),
    ("assignmethod", []), ("assignmethod", ["ab" * 32]), ("assignmethod", ["ab" * 32, "nosuchmethod"]),
    ("assignmethod", ["ab" * 32, 3]), ("assignmethod", ["mods", "banevent"]),
    ("assignmethod", ["ab" * 32, "supportedmethods"]),
    ("unassignmethod", ["ab" * 32]), ("unassignmethod", ["ab" * 32, "nosuchmethod"]),
    ("assignrolemethod", ["nosuchrole", "banevent"]), ("assignrolemethod", ["", "banevent"]),
    ("assignrolemethod", ["r"]), ("unassignrolemethod", [["r"], "banevent"]),
]


@pytest.mark.parametrize(("method", "params"), BAD_PARAMS, ids=[f"{m}{p!r:.40}" for m, p in BAD_PARAMS])
async def test_bad_params_get_200_with_an_invalid_error(managed, method, params):
    """Each new method refuses a missing or ill-typed parameter, an unknown role or method: 200, "invalid:",
    and nothing changes."""
    await result(managed.port, "createrole", "r")
    status, answer = await call(managed.port, method, *params)
    assert status == 200 and answer["result"] is None and answer["error"].startswith("invalid: "), answer
    assert await result(managed.port, "listroles") == [
        {"id": "r", "label": "", "description": "", "color": "", "order": 0, "methods": [], "pubkeys": []}]
    assert await result(managed.port, "listmethodassignees") == []


NIP86_METHODS = """supportedmethods banpubkey unbanpubkey listbannedpubkeys allowpubkey unallowpubkey listallowedpubkeys
createrole editrole deleterole assignrole unassignrole assignmethod unassignmethod listmethodassignees
listeventsneedingmoderation allowevent unallowevent banevent unbanevent listbannedevents listallowedevents
changerelayname changerelaydescription changerelayicon allowkind disallowkind listallowedkinds listdisallowedkinds
blockip unblockip listblockedips""".split()
"""Every method NIP-86 (nostr-protocol/nips 86.md) lists."""


async def test_supportedmethods_lists_every_method_nip86_lists(managed):
    """An admin's supportedmethods names each method of NIP-86's list, each once."""
    methods = await result(managed.port, "supportedmethods")
    assert set(NIP86_METHODS) <= set(methods) and len(methods) == len(set(methods))


async def test_nobody_bans_an_admin_or_blocks_too_wide_and_grantees_block_single_addresses(managed):
    """banpubkey of an `[admin] pubkeys` pubkey: "restricted:" naming the configuration, for a grantee and an
    admin alike; blockip: a grantee only single addresses, nobody a network wider than /8 (IPv4), /32 (IPv6);
    a reason past 1,000 characters: "invalid:"."""
    admin = admin_keys().public_key().to_hex()
    for method in ("banpubkey", "blockip", "listbannedpubkeys", "listblockedips"):
        await result(managed.port, "assignmethod", MOD, method)
    for status, answer in (await as_moderator(managed, "banpubkey", admin), await call(managed.port, "banpubkey", admin)):
        assert status == 200 and answer["error"].startswith("restricted: ") and "[admin] pubkeys" in answer["error"]
    for network in ("0.0.0.0/0", "10.0.0.0/8", "192.0.2.0/31", "2001:db8::/64"):
        status, answer = await as_moderator(managed, "blockip", network)
        assert status == 200 and answer["error"].startswith("restricted: "), (network, answer)
    for network in ("0.0.0.0/0", "10.0.0.0/7", "::/0", "2001:db8::/31"):
        status, answer = await call(managed.port, "blockip", network)
        assert status == 200 and answer["error"].startswith("restricted: ") and "wider than" in answer["error"]
    assert await as_moderator(managed, "blockip", "192.0.2.7") == (200, {"result": True})
    assert await as_moderator(managed, "blockip", "2001:db8::7/128") == (200, {"result": True})
    assert await result(managed.port, "blockip", "10.0.0.0/8") is True
    assert await result(managed.port, "blockip", "2001:db8::/32") is True
    assert {e["ip"] for e in (await as_moderator(managed, "listblockedips"))[1]["result"]} == {
        "192.0.2.7/32", "2001:db8::7/128", "10.0.0.0/8", "2001:db8::/32"}
    assert (await as_moderator(managed, "banpubkey", "ab" * 32, "x" * 1000)) == (200, {"result": True})
    status, answer = await as_moderator(managed, "banpubkey", "cd" * 32, "x" * 1001)
    assert status == 200 and answer["error"].startswith("invalid: ")
    assert [e["pubkey"] for e in (await as_moderator(managed, "listbannedpubkeys"))[1]["result"]] == ["ab" * 32]
