"""GET /metrics: Prometheus text from a real relay, after real traffic (relay/metrics.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relay.protocol.negentropy import Negentropy, SortedVector
from relay.sync.state import add_counts
from tests.conftest import make_config
from tests.helpers import Client
from tests.inprocess import Relay
from tests.served import free_port, healthy

PEER = "ws://peer.example"  # a row in sync_peers that no configured peer writes


def scrape(relay: Relay) -> tuple[str, dict[tuple[str, tuple], float]]:
    """(Content-Type, {(sample name, sorted labels): value}) of GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{relay.port}/metrics", timeout=5) as response:
        content_type, text = response.headers["Content-Type"], response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return content_type, samples


# the writer in this test's process keeps a registry of its own (relay/metrics.py `inherited_multiprocess`), so with
# worker processes /metrics is the answering worker's alone; the whole relay's page: tests/server/test_workers_shared.py
@pytest.mark.single_process
async def test_metrics_count_connections_events_queries_sessions_projectors_and_peers(tmp_path, alice):
    """Every metric family moves with the traffic that should move it, and only by that much."""
    dead_peer = f"ws://127.0.0.1:{free_port()}"  # nothing listens: every sync attempt fails
    relay = Relay(make_config(tmp_path, sync={"peers": [{"url": dead_peer}], "backoff_initial_seconds": 30.0,
                                               "backoff_max_seconds": 30.0}))
    await relay.start()
    client = await Client.connect(relay.url)
    try:
        _, before = await asyncio.to_thread(scrape, relay)
        assert before[("relay_connections", ())] == 1
        assert before[("relay_events_received_total", ())] == 0

        note = alice.sign(content="counted")
        bad_sig = {**alice.sign(content="forged"), "sig": "00" * 64}
        not_json = alice.sign(kind=0, content="not JSON")  # stored; the profiles projector refuses it
        ephemeral = alice.sign(kind=20001)
        replies = [await client.publish(e) for e in (note, note, bad_sig, not_json, ephemeral)]
        assert [r[2] for r in replies] == [True, True, False, True, True]
        assert replies[1][3].startswith("duplicate:") and replies[2][3].startswith("invalid:")
        assert [e["id"] for e in await client.req("live", {"kinds": [1]})] == [note["id"]]
        await client.send(["COUNT", "c", {"kinds": [1]}])
        assert (await client.recv())[:2] == ["COUNT", "c"]
        await client.send(["NEG-OPEN", "n", {}, Negentropy(SortedVector.from_items([])).initiate().hex()])
        assert (await client.recv())[:2] == ["NEG-MSG", "n"]
        with sqlite3.connect(relay.config.store.path) as conn:
            add_counts(conn, PEER, 7, 3, success_at=1_700_000_000)

        deadline = time.monotonic() + 30
        while True:  # the first attempt on the dead peer fails at start-up; wait until it is recorded
            content_type, m = await asyncio.to_thread(scrape, relay)
            if m.get(("relay_sync_errors_total", (("peer", dead_peer),)), 0) >= 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
    finally:
        await client.close()
        db_bytes = relay.store.path.stat().st_size
        await relay.stop()

    assert content_type.startswith("text/plain; version=0.0.4")
    assert m[("relay_connections", ())] == 1
    assert m[("relay_subscriptions", ())] == 1
    assert m[("relay_negentropy_sessions", ())] == 1
    assert m[("relay_events_received_total", ())] == 5
    assert m[("relay_events_stored_total", ())] == 2
    assert m[("relay_events_ephemeral_total", ())] == 1
    refused = {labels[0][1]: v for (name, labels), v in m.items() if name == "relay_events_refused_total"}
    assert refused == {"invalid": 1, "duplicate": 1, "blocked": 0, "rate-limited": 0, "pow": 0, "restricted": 0,
                       "mute": 0, "error": 0, "auth-required": 0}
    assert m[("relay_query_seconds_count", (("verb", "REQ"),))] == 1
    assert m[("relay_query_seconds_count", (("verb", "COUNT"),))] == 1
    assert m[("relay_query_seconds_sum", (("verb", "REQ"),))] > 0
    # the valid note, its duplicate and the kind 0 reach the writer; the bad signature and the ephemeral do not
    assert m[("relay_writer_batch_events_sum", ())] == 3
    assert 1 <= m[("relay_writer_batch_events_count", ())] <= 3
    assert m[("relay_writer_commit_seconds_count", ())] == m[("relay_writer_batch_events_count", ())]
    assert m[("relay_slow_readers_disconnected_total", ())] == 0
    assert m[("relay_keepalive_timeouts_total", ())] == 0
    assert m[("relay_connections_refused_total", ())] == 0
    assert 0 < m[("relay_database_bytes", (("file", "db"),))] <= db_bytes  # a database file never shrinks here
    assert ("relay_database_bytes", (("file", "wal"),)) in m
    assert m[("relay_projector_refusals_total", (("projector", "profiles"),))] == 1
    assert m[("relay_projector_refusals_total", (("projector", "follows"),))] == 0  # every projector, from the start
    assert m[("relay_sync_events_in_total", (("peer", PEER),))] == 7
    assert m[("relay_sync_events_out_total", (("peer", PEER),))] == 3
    assert m[("relay_sync_last_success_timestamp_seconds", (("peer", PEER),))] == 1_700_000_000
    assert m[("relay_sync_errors_total", (("peer", dead_peer),))] >= 1
    assert ("relay_sync_errors_total", (("peer", PEER),)) not in m  # not configured: no in-process attempts


@pytest.mark.single_process  # the registries of two writers in this process (with workers, /metrics is a worker's)
async def test_each_relay_has_its_own_registry(tmp_path, alice):
    """Two relays in one process count their own events only (no global registry)."""
    first = Relay(make_config(tmp_path / "a"))
    second = Relay(make_config(tmp_path / "b"))
    await first.start()
    await second.start()
    try:
        client = await Client.connect(first.url)
        assert (await client.publish(alice.sign(content="only in the first")))[2] is True
        await client.close()
        _, a = await asyncio.to_thread(scrape, first)
        _, b = await asyncio.to_thread(scrape, second)
    finally:
        await first.stop()
        await second.stop()
    assert a[("relay_events_stored_total", ())] == 1
    assert b[("relay_events_stored_total", ())] == 0


async def test_http_paths_ignore_the_query_string_and_cors_names_only_get(relay):
    """/metrics?x=1 and /health?probe are those paths (not a WebSocket upgrade); CORS allows GET, the only method
    the relay's routes serve (websockets answers others 405)."""
    def get(path: str) -> tuple[int, str, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{relay.port}{path}", timeout=5) as response:
            return response.status, response.headers["Access-Control-Allow-Methods"], response.read().decode()

    status, methods, body = await asyncio.to_thread(get, "/metrics?x=1")
    assert (status, methods) == (200, "GET") and "relay_connections" in body
    status, methods, body = await asyncio.to_thread(get, "/health?probe")
    assert (status, methods) == (200, "GET") and healthy(body.encode())
