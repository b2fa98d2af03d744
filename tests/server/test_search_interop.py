"""NIP-50 search from independent clients on the real data: nostr-sdk's `Filter().search(...)` (rust-nostr) and
nostr-tools' `Relay.subscribe` (JavaScript), against a real server on a real SQLite file.

The expected answers are computed here from the events, with a tokenizer of our own (runs of letters and
digits, lowercased), not by the relay's FTS5.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import nostr_sdk as sdk
import pytest

from tests.helpers import REAL_EVENTS, Client, import_into

TIMEOUT = timedelta(seconds=10)
JS_DIR = Path(__file__).resolve().parents[1] / "js"
pytestmark = pytest.mark.skipif(not REAL_EVENTS.exists(), reason="needs ../shared/data (see its SOURCES.md)")


def words(text: str) -> set[str]:
    return set(re.findall(r"[^\W_]+", text.lower()))


@pytest.fixture
async def loaded(relay):
    """`relay` holding every real event that its rules accept; returns the stored kind 1 and kind 0 events."""
    report = await import_into(relay.store, REAL_EVENTS.read_bytes().split(b"\n"))
    assert report.stored > 5000
    client = await Client.connect(relay.url)
    try:
        stored = {kind: await client.req("all", {"kinds": [kind], "limit": 5000}) for kind in (0, 1)}
    finally:
        await client.close()
    return stored


def nip05(profile: dict) -> str:
    """A kind-0 event's nip05, lowercase ("" when its content has none)."""
    try:
        value = json.loads(profile["content"]).get("nip05")
    except (ValueError, AttributeError):
        return ""
    return value.lower() if type(value) is str else ""


def expected_notes(stored: dict, *wanted: str) -> set[str]:
    return {e["id"] for e in stored[1] if words(e["content"]) >= set(wanted)}


async def test_nostr_sdk_search_on_the_real_data(relay, loaded):
    """nostr-sdk's search filter gets every note holding the words (none other), a limit of the best ones, and
    the profiles of a nip05 domain; each event verified by nostr-sdk."""
    client = sdk.ClientBuilder().build()
    url = sdk.RelayUrl.parse(relay.url)
    await client.add_relay(url)
    await client.connect(TIMEOUT)
    try:
        async def fetch(f: sdk.Filter) -> list[sdk.Event]:
            return await client.fetch_events(sdk.ReqTarget.auto([f]), TIMEOUT)

        for query in ("bitcoin", "bitcoin lightning", "relays"):
            got = await fetch(sdk.Filter().search(query).kind(sdk.Kind(1)).limit(1000))
            assert all(e.verify() for e in got)
            expected = expected_notes(loaded, *query.split())
            assert expected and {e.id().to_hex() for e in got} == expected, query
        best = await fetch(sdk.Filter().search("bitcoin").kind(sdk.Kind(1)).limit(20))
        assert len(best) == 20 and {e.id().to_hex() for e in best} <= expected_notes(loaded, "bitcoin")
        profiles = await fetch(sdk.Filter().search("domain:nostrplebs.com").limit(1000))
        expected = {e["id"] for e in loaded[0] if nip05(e).endswith("@nostrplebs.com")}
        assert len(expected) > 50 and {e.id().to_hex() for e in profiles} == expected
    finally:
        await client.shutdown()


def nostr_tools_search(url: str, f: dict) -> dict:
    node = shutil.which("node")
    assert node, "node is needed for the nostr-tools interop test"
    done = subprocess.run([node, "--experimental-websocket", "search_driver.mjs", url, json.dumps(f)], cwd=JS_DIR,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


async def test_nostr_tools_search_on_the_real_data(relay, loaded):
    """nostr-tools gets the same notes in the relay's relevance order, a prefix search, and CLOSED "invalid:"
    for an empty search."""
    f = {"search": "bitcoin", "kinds": [1], "limit": 20}
    answer = await asyncio.to_thread(nostr_tools_search, relay.url, f)
    got = answer["ids"]
    client = await Client.connect(relay.url)
    try:
        assert got == [e["id"] for e in await client.req("s", f)]
    finally:
        await client.close()
    assert len(got) == 20 and set(got) <= expected_notes(loaded, "bitcoin")
    prefix = (await asyncio.to_thread(nostr_tools_search, relay.url, {"search": "bitco*", "kinds": [1],
                                                                       "limit": 1000}))["ids"]
    assert set(prefix) == {e["id"] for e in loaded[1] if any(w.startswith("bitco") for w in words(e["content"]))}
    closed = await asyncio.to_thread(nostr_tools_search, relay.url, {"search": "  "})
    assert closed["closed"].startswith("invalid:")
