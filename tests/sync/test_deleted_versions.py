"""Two of our relays, peered both ways, agree on a coordinate whose newest version was deleted by an `e` tag
(docs/architecture.md, invariant 5: the mark survives, and its evidence travels; relay/store/evidence.py).

In both cases one node holds the mark of the deleted v2 and the other an
older v1 that it would serve for ever: the node with the mark fetches v1 in
its reconciliation, refuses it, and sends the deletion and v2, so the other
node's mark rises and v1 goes there too.  Relays run in this process.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

import structlog

from relay.commands.status import render_status
from relay.status import gather_status
from relay.sync.state import read_states
from tests.conftest import make_config
from tests.helpers import eventually
from tests.inprocess import Relay
from tests.served import free_port
from relay.sync.session import NOT_SENT
from tests.sync.conftest import peered_node, peered_pair, publish, remote_ids
from tests.sync.mesh import table_dumps

NOW = int(time.time())
TIMEOUT = 15.0


def _versions(alice):
    v1 = alice.sign(30023, "v1", [["d", "post"], ["title", "one"]], NOW - 20)
    v2 = alice.sign(30023, "v2", [["d", "post"], ["title", "two"]], NOW - 10)
    return v1, v2, alice.sign(5, "", [["e", v2["id"]]], NOW - 5)


async def _agree(a: Relay, b: Relay, wanted: set[str]) -> bool:
    return await remote_ids(a.url) == wanted and await remote_ids(b.url) == wanted


def _same_tables(a: Relay, b: Relay) -> bool:
    """Both nodes hold the same stored events and `articles` rows (none: the only article version is deleted)."""
    dumps = [table_dumps(Path(n.config.store.path), ["articles"]) for n in (a, b)]
    return dumps[0] == dumps[1] and dumps[0]["articles"] == []


async def test_deletion_first_on_one_node_and_an_older_version_on_the_other(tmp_path, alice):
    """D then v2 to B (v2 refused, its mark kept), v1 to A: both end serving D alone, v1 refused on both."""
    v1, v2, deletion = _versions(alice)
    async with peered_pair(tmp_path) as (a, b):
        with structlog.testing.capture_logs() as logs:
            replies = await publish(b.url, [deletion, v2])
            assert [r[2:] for r in replies] == [[True, ""], [False, "blocked: this event was deleted"]]
            assert (await publish(a.url, [v1]))[0][2:] == [True, ""]
            assert await eventually(lambda: _agree(a, b, {deletion["id"]}), TIMEOUT)
        assert _same_tables(a, b)
        for node in (a, b):
            reply = (await publish(node.url, [v1]))[0]
            assert reply[2:] == [False, "duplicate: have a newer version"]
    sent = [e for e in logs if e["event"] == "sync_reconciled" and e["evidence"]]
    assert sent and all(e["evidence"] == {"blocked: this event was deleted": 1} for e in sent)


async def test_a_node_that_was_away_drops_the_older_version_it_held(tmp_path, alice):
    """v1 to A and synced to B; B stopped; v2 then D to A; B restarted: both end serving D alone."""
    v1, v2, deletion = _versions(alice)
    async with peered_pair(tmp_path) as nodes:
        a, b = nodes
        assert (await publish(a.url, [v1]))[0][2] is True
        assert await eventually(lambda: _agree(a, b, {v1["id"]}), TIMEOUT)
        await b.stop()
        assert [r[2] for r in await publish(a.url, [v2, deletion])] == [True, True]
        nodes[1] = b = peered_node(tmp_path, "b", b.config.server.port, a.config.server.port)
        await b.start()
        assert await eventually(lambda: _agree(a, b, {deletion["id"]}), TIMEOUT)
        assert _same_tables(a, b)


async def test_a_refusal_that_lasts_is_counted_and_logged_once(tmp_path, alice):
    """A's note is refused by B (a kind B does not take) in every reconciliation: after the second one,
    sync_peers, /metrics and `relay status` count one lasting difference, and the log names its id once."""
    note = alice.sign(1, "not taken there", [], NOW - 30)
    pb = free_port()
    a = peered_node(tmp_path, "a", free_port(), pb)
    (tmp_path / "b").mkdir()
    b = Relay(make_config(tmp_path / "b", server={"port": pb}, auth={"deny_kinds": [1]}))
    await b.start()
    try:
        with structlog.testing.capture_logs() as logs:
            await a.start()
            assert (await publish(a.url, [note]))[0][2] is True

            def runs() -> int:
                return sum(e["event"] == "sync_reconciled" for e in logs)

            assert await eventually(lambda: runs() >= 5, TIMEOUT)
            text = (await a.metrics.render()).decode()
            status = render_status(gather_status(a.config))
        with closing(sqlite3.connect(a.config.store.path)) as conn:
            [state] = read_states(conn)
        assert state.lasting_differences == 1
        named = [e for e in logs if e["event"] == "sync_lasting_differences"]
        assert [(e["count"], e["ids"]) for e in named] == [(1, [note["id"]])]
        assert f'relay_sync_lasting_differences{{peer="{b.url}"}} 1.0' in text
        assert "lasting differences 1:" in status
    finally:
        await a.stop()
        await b.stop()


async def test_a_relay_of_other_software_is_never_sent_a_deleted_version(tmp_path, local_relay, alice):
    """rust-nostr's LocalRelay stores an event sent after its deletion: so it keeps v1, is never sent v2 (it would
    serve it), and the difference is counted as lasting here, where D alone is served."""
    v1, v2, deletion = _versions(alice)
    url = await local_relay()
    assert (await publish(url, [v1]))[0][2] is True
    (tmp_path / "a").mkdir()
    node = Relay(make_config(tmp_path / "a", sync={"peers": [{"url": url}], "interval_seconds": 0.5}))
    await node.start()
    try:
        with structlog.testing.capture_logs() as logs:
            assert [r[2] for r in await publish(node.url, [deletion, v2])] == [True, False]
            assert await eventually(lambda: any(e["event"] == "sync_lasting_differences" for e in logs), TIMEOUT)
        assert await remote_ids(url) == {v1["id"], deletion["id"]}
        assert await remote_ids(node.url) == {deletion["id"]}
    finally:
        await node.stop()
    evidence = [e["evidence"] for e in logs if e["event"] == "sync_reconciled"]
    assert {NOT_SENT: 1} in evidence and all(e in ({}, {NOT_SENT: 1}) for e in evidence)
