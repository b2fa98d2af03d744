"""NIP-70 with the independent rust-nostr client (`nostr-sdk`): its automatic NIP-42 AUTH lets the author
publish a protected event; another signer is refused with "restricted:"."""

from __future__ import annotations

import asyncio

import nostr_sdk as sdk
import pytest

from tests.conftest import make_config
from tests.inprocess import Relay
from tests.server.test_interop_nostr_sdk import TIMEOUT, accepted, failure, fetch


@pytest.fixture
async def callbacks_on_this_loop():
    """nostr-sdk calls the Python authenticator back on the loop it is given (else on none: it fails); it is
    a global of the module, reset afterwards so later tests' loops are not taken for a closed one."""
    sdk.uniffi_set_event_loop(asyncio.get_running_loop())
    yield
    sdk.uniffi_set_event_loop(None)


async def signed_in(relay, keys: sdk.Keys) -> sdk.Client:
    """A nostr-sdk client that answers AUTH challenges itself with `keys` (NIP-42), connected to `relay`."""
    client = sdk.ClientBuilder().authenticator(sdk.SignerAuthenticator(keys)).build()
    await client.add_relay(sdk.RelayUrl.parse(relay.url))
    await client.connect(TIMEOUT)
    return client


@pytest.mark.parametrize("on_connect", [True, False])
async def test_nostr_sdk_publishes_its_own_protected_event_after_auth_and_not_anothers(tmp_path, on_connect,
                                                                                       callbacks_on_this_loop):
    """nostr-sdk answers the challenge (sent when the connection opens, or after its "auth-required:" refusal)
    and resends: stored for the author's client; "restricted:" for a client signed in as someone else."""
    relay = Relay(make_config(tmp_path, auth={"challenge_on_connect": on_connect}))
    await relay.start()
    try:
        await _publish_protected(relay)
    finally:
        await relay.stop()


async def _publish_protected(relay) -> None:
    author, other = sdk.Keys.generate(), sdk.Keys.generate()
    protected = sdk.EventBuilder(sdk.Kind(1), "protected by NIP-70").tags([sdk.Tag.protected()]).finalize(author)
    assert protected.is_protected()
    stranger = await signed_in(relay, other)
    try:
        assert failure(await stranger.send_event(protected)).startswith("restricted: ")
    finally:
        await stranger.shutdown()
    client = await signed_in(relay, author)
    try:
        assert accepted(await client.send_event(protected), relay)
        assert [e.id().to_hex() for e in await fetch(client, sdk.Filter().author(author.public_key()))] == [
            protected.id().to_hex()]
    finally:
        await client.shutdown()
