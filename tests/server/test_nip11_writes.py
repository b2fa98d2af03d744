"""NIP-11 `limitation` follows the write rules in effect: `[auth]`, NIP-86's kinds and `[[policies]]` together."""

from __future__ import annotations

from tests.conftest import make_config
from tests.inprocess import Relay
from tests.policies.sample import serving
from tests.server.nip86 import admin_config, result
from tests.served import nip11


async def test_restricted_writes_follows_nip86_kinds_at_once(tmp_path, alice):
    """An open relay says restricted_writes false; a banpubkey leaves it so (no condition a client could
    meet); after disallowkind the next NIP-11 document says true."""
    relay = Relay(make_config(tmp_path, **admin_config()))
    await relay.start()
    try:
        assert (await nip11(relay))["limitation"]["restricted_writes"] is False
        await result(relay.port, "banpubkey", alice.pubkey)
        assert (await nip11(relay))["limitation"]["restricted_writes"] is False
        await result(relay.port, "disallowkind", 4)
        limitation = (await nip11(relay))["limitation"]
        assert (limitation["restricted_writes"], limitation["auth_required"]) == (True, False)
    finally:
        await relay.stop()


POW_EVERY_KIND = """
[[policies]]
call = "relay.policies.builtin:min_pow"
options = { bits = 12 }
"""


async def test_a_client_policy_restricts_writes_and_min_pow_shows_its_difficulty(tmp_path):
    """min_pow for every kind from clients: restricted_writes and min_pow_difficulty 12; for some kinds only:
    restricted_writes without min_pow_difficulty; a policy for peers only: neither."""
    async with serving(tmp_path / "every", POW_EVERY_KIND) as relay:
        limitation = (await nip11(relay))["limitation"]
        assert (limitation["restricted_writes"], limitation.get("min_pow_difficulty")) == (True, 12)
    async with serving(tmp_path / "some", POW_EVERY_KIND.replace("bits = 12", "bits = 12, kinds = [1]")) as relay:
        limitation = (await nip11(relay))["limitation"]
        assert (limitation["restricted_writes"], "min_pow_difficulty" in limitation) == (True, False)
    async with serving(tmp_path / "peers", POW_EVERY_KIND + 'sources = ["peer"]\n') as relay:
        limitation = (await nip11(relay))["limitation"]
        assert (limitation["restricted_writes"], "min_pow_difficulty" in limitation) == (False, False)
