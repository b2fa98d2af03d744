"""Rate limits that do not break sync: loopback clients are exempt unless a proxy's header names a client.

A bulk client on this host (nostr-sdk's Relay.sync, `strfry sync`) ran into the shipped per-connection
limits and stalled; `[rate_limits] exempt_loopback` (default true) lets it through, except for a request
carrying X-Forwarded-For or Forwarded (behind a proxy on this host every client is loopback).
"""

from __future__ import annotations

import json

import nostr_sdk as sdk
from structlog.testing import capture_logs

from relay.config import RateLimitConfig
from relay.protocol.filters import Filter
from relay.server.ratelimit import RateLimits
from tests.conftest import make_config
from tests.helpers import Client, Keys, store_events
from tests.inprocess import Relay
from tests.server.test_negentropy_server import sdk_relay

SHIPPED = {"exempt": []}  # the tests' relays exempt loopback by list: back to the shipped [rate_limits]


async def test_nostr_sdk_syncs_and_publishes_in_bulk_from_loopback_with_the_shipped_limits(tmp_path):
    """From 127.0.0.1 with the shipped [rate_limits]: nostr-sdk's Relay.sync (down) receives the relay's 300
    events, and the same client then publishes 1,000 (more than the 100-EVENT burst at 10 per second), all
    accepted."""
    relay = Relay(make_config(tmp_path, rate_limits=SHIPPED))
    await relay.start()
    keys = Keys(0x5EED)
    theirs = [keys.sign(content=f"r{i}", created_at=1_700_000_000 + i) for i in range(300)]
    ours = [keys.sign(content=f"c{i}", created_at=1_700_000_000 + i) for i in range(1000)]
    await store_events(relay.store, theirs)
    try:
        async with sdk_relay(relay.url) as (client, handle):
            summary = await handle.sync(sdk.Filter(), [], sdk.SyncOptions().direction(sdk.SyncDirection.DOWN))
            assert len(summary.received) == len(theirs)
            refused = 0
            for event in ours:
                output = await client.send_event(sdk.Event.from_json(json.dumps(event)))
                refused += len(output.failed)
        assert refused == 0
        assert await relay.store.count([Filter()]) == len(theirs) + len(ours)
    finally:
        await relay.stop()


def test_loopback_is_exempt_unless_the_request_names_a_client_and_that_is_warned_once():
    """open(): loopback without a forwarding header is not limited; with one it is, and the warning is
    logged once; exempt_loopback = false limits loopback too; other addresses are limited as before."""
    limits = RateLimits(RateLimitConfig())
    assert limits.open("127.0.0.1") is None and limits.open("::1") is None
    with capture_logs() as logs:
        assert limits.open("127.0.0.1", proxied=True) is not None
        assert limits.open("127.0.0.1", proxied=True) is not None
    assert [entry["event"] for entry in logs] == ["rate_limits_proxy_not_trusted"]
    assert limits.open("192.0.2.1") is not None
    assert RateLimits(RateLimitConfig(exempt_loopback=False)).open("127.0.0.1") is not None


async def test_a_proxied_loopback_connection_is_limited(tmp_path, alice):
    """Through the real server with one EVENT per connection: a plain loopback client publishes freely, one
    whose request carries X-Forwarded-For (no trusted_proxies) gets "rate-limited:" for its second EVENT."""
    relay = Relay(make_config(tmp_path, rate_limits={**SHIPPED, "events_per_second": 0.01, "events_burst": 1}))
    await relay.start()
    try:
        plain = await Client.connect(relay.url)
        assert all([(await plain.publish(alice.sign(content=f"p{i}")))[2] for i in range(3)])
        proxied = await Client.connect(relay.url, additional_headers={"X-Forwarded-For": "198.51.100.7"})
        oks = [await proxied.publish(alice.sign(content=f"x{i}")) for i in range(2)]
        assert [ok[2] for ok in oks] == [True, False] and oks[1][3].startswith("rate-limited: ")
        for c in (plain, proxied):
            await c.close()
    finally:
        await relay.stop()
