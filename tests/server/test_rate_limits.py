"""Rate limits per connection and per client IP, through the real server; client IPs behind trusted proxies.

Rates here are tiny (one token per 100 s), so no bucket refills during a
test: every outcome follows from the burst sizes alone.
"""

from __future__ import annotations

import pytest
from websockets.exceptions import ConnectionClosed

from relay.config import RateLimitConfig
from relay.server.ratelimit import TOO_MANY_CONNECTIONS, RateLimits
from tests.helpers import Client, eventually
from tests.server.test_auth import closed_or_events, neg_need

SLOW = 0.01  # tokens per second: none comes back during a test
UNLIMITED = {f"{scope}{what}_per_second": 0.0 for scope in ("", "ip_") for what in ("events", "reqs", "neg_opens")}


def limits(**values) -> dict:
    """A [rate_limits] section: loopback not exempt, everything unlimited but `values`."""
    return {"rate_limits": {"exempt": [], "exempt_loopback": False, **UNLIMITED, **values}}


async def test_connection_limits_answer_rate_limited_and_the_connection_keeps_working(start, alice):
    """Past its burst a connection gets OK false / CLOSED / NEG-ERR "rate-limited:", and still gets answers to
    other messages; another connection from the same IP has buckets of its own."""
    relay = await start(**limits(events_per_second=SLOW, events_burst=2, reqs_per_second=SLOW, reqs_burst=2,
                                 neg_opens_per_second=SLOW, neg_opens_burst=1))
    client = await Client.connect(relay.url)
    events = [alice.sign(content=f"n{i}", created_at=1_700_000_000 + i) for i in range(3)]
    oks = [await client.publish(e) for e in events]
    assert [ok[2] for ok in oks] == [True, True, False]
    assert oks[2][3].startswith("rate-limited: ")
    assert await closed_or_events(client, "REQ", "a", {"kinds": [1]}) == ("EVENTS", events[1::-1])
    assert await closed_or_events(client, "COUNT", "b", {"kinds": [1]}) == ("COUNT", 2)
    kind, message = await closed_or_events(client, "REQ", "c", {"kinds": [1]})
    assert kind == "CLOSED" and message.startswith("rate-limited: ")
    assert await neg_need(client, "n1", {}) == {e["id"] for e in events[:2]}
    assert (await neg_need(client, "n2", {})).startswith("rate-limited: ")

    other = await Client.connect(relay.url)
    assert (await other.publish(events[2]))[2] is True
    for c in (client, other):
        await c.close()


async def test_ip_limits_span_connections(start, alice):
    """The per-IP bucket is shared by every connection from that IP."""
    relay = await start(**limits(ip_events_per_second=SLOW, ip_events_burst=2))
    first, second = await Client.connect(relay.url), await Client.connect(relay.url)
    assert (await first.publish(alice.sign(content="1")))[2] is True
    assert (await second.publish(alice.sign(content="2")))[2] is True
    ok = await first.publish(alice.sign(content="3"))
    assert ok[2] is False and ok[3].startswith("rate-limited: ")
    for c in (first, second):
        await c.close()


@pytest.mark.single_process  # reads the server's connections and connections_refused (across workers:
# test_workers_shared.py test_ip_connections_hold_across_workers, from /metrics)
async def test_an_ip_past_its_connections_gets_the_next_closed_and_others_connect(start, alice):
    """`ip_connections = 3` behind a trusted proxy: a fourth connection from one client IP is closed at once
    (1008 "rate-limited: too many connections from this address") and counted; another IP connects; once one
    of the three has closed, the first IP connects again."""
    relay = await start(**limits(ip_connections=3, trusted_proxies=["127.0.0.1"]))

    async def connect(ip: str) -> Client:
        return await Client.connect(relay.url, additional_headers={"X-Forwarded-For": ip})

    first = [await connect("198.51.100.1") for _ in range(3)]
    refused = await connect("198.51.100.1")
    with pytest.raises(ConnectionClosed):
        await refused.recv()
    assert (refused.ws.close_code, refused.ws.close_reason) == (1008, TOO_MANY_CONNECTIONS)
    assert TOO_MANY_CONNECTIONS == "rate-limited: too many connections from this address"
    assert relay.connections_refused == 1
    other = await connect("198.51.100.2")
    assert (await other.publish(alice.sign(content="from another address")))[2] is True
    await first.pop().close()
    assert await eventually(lambda: len(relay.connections) == 3)
    again = await connect("198.51.100.1")
    assert (await again.publish(alice.sign(content="again")))[2] is True
    assert relay.connections_refused == 1
    for c in (*first, other, again):
        await c.close()


async def test_forwarded_for_is_honoured_only_from_a_trusted_proxy(start, alice):
    """Behind a trusted proxy each X-Forwarded-For client has its own IP bucket and exempt clients have none;
    from an untrusted peer the header is ignored (one bucket: the peer's)."""
    section = limits(ip_events_per_second=SLOW, ip_events_burst=1)["rate_limits"]
    trusted = await start("trusted", rate_limits={**section, "trusted_proxies": ["127.0.0.1"],
                                                  "exempt": ["198.51.100.9"]})
    untrusted = await start("untrusted", rate_limits={**section, "trusted_proxies": ["10.0.0.0/8"]})

    async def publish_twice(relay, client_ip: str) -> list[bool]:
        client = await Client.connect(relay.url, additional_headers={"X-Forwarded-For": f"203.0.113.1, {client_ip}"})
        try:
            return [(await client.publish(alice.sign(content=f"{client_ip} {i}")))[2] for i in range(2)]
        finally:
            await client.close()

    assert await publish_twice(trusted, "198.51.100.1") == [True, False]
    assert await publish_twice(trusted, "198.51.100.2") == [True, False]
    assert await publish_twice(trusted, "198.51.100.9") == [True, True]  # exempt
    assert await publish_twice(untrusted, "198.51.100.1") == [True, False]
    assert await publish_twice(untrusted, "198.51.100.2") == [False, False]  # the same bucket: 127.0.0.1's


def test_client_ip_reads_forwarded_for_from_the_right_past_trusted_proxies():
    """Only hops appended by trusted proxies are believed; what the client wrote on the left is not."""
    limits = RateLimits(RateLimitConfig(trusted_proxies=("10.0.0.0/8", "::1")))
    assert limits.client_ip("10.0.0.1", "1.1.1.1, 203.0.113.7") == "203.0.113.7"
    assert limits.client_ip("10.0.0.1", "203.0.113.7, 10.0.0.2") == "203.0.113.7"
    assert limits.client_ip("10.0.0.1", "10.0.0.3,10.0.0.2") == "10.0.0.3"  # all trusted: the farthest
    assert limits.client_ip("10.0.0.1", "garbage, 10.0.0.2") == "10.0.0.2"
    assert limits.client_ip("10.0.0.1", None) == "10.0.0.1"
    assert limits.client_ip("::1", "2001:db8::5") == "2001:db8::5"
    assert limits.client_ip("192.0.2.1", "203.0.113.7") == "192.0.2.1"  # not a trusted proxy


def test_idle_ip_buckets_are_kept_then_forgotten_within_bounds():
    """An IP's spent bucket outlives its connection (reconnecting does not refill it), up to `max_idle_ips` IPs."""
    config = RateLimitConfig(**{**UNLIMITED, "ip_events_per_second": SLOW, "ip_events_burst": 1})
    limits = RateLimits(config, max_idle_ips=2)
    rate = limits.open("192.0.2.1")
    assert rate.allow(0) and not rate.allow(0)
    limits.close(rate)
    again = limits.open("192.0.2.1")
    assert not again.allow(0)
    limits.close(again)
    for i in range(2, 5):
        limits.close(limits.open(f"192.0.2.{i}"))
    assert limits.open("192.0.2.1").allow(0)  # forgotten: more than 2 idle IPs came after it
    assert RateLimits(RateLimitConfig(exempt=("192.0.2.0/24",))).open("192.0.2.1") is None
    assert RateLimits(RateLimitConfig(enabled=False)).open("192.0.2.1") is None
