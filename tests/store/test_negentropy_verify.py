"""`relay verify` checks the NIP-77 negentropy index against the events table (items and node sums)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from relay.hooks import hooks
from relay.projector_commands import run_verify
from relay.protocol.event import EventLimits, parse_event
from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import REAL_EVENTS, read_jsonl

INDEXED = {"kinds": [0]}


@pytest.fixture
async def config(tmp_path):
    """A config indexing the full set and kind 0, on a database holding 300 real events."""
    config = make_config(tmp_path, negentropy={"filters": [INDEXED]})
    store = await Store.open(config.store.path, config.store.options(1), hooks(config))
    try:
        for event in read_jsonl(REAL_EVENTS)[:300]:
            await store.submit(parse_event(event, EventLimits(), time.time()))
    finally:
        await store.close()
    return config


def tamper(config, sql: str) -> None:
    conn = sqlite3.connect(config.store.path)
    with conn:
        conn.execute(sql)
    conn.close()


def test_verify_passes_on_an_index_kept_by_the_writer(config, capsys):
    """Both indexes (full set, kinds 0) agree with the events: exit 0, one ok line each."""
    assert run_verify(config) == 0
    out = capsys.readouterr().out
    assert "negentropy index {}: ok, " in out
    assert 'negentropy index {"kinds":[0]}: ok, ' in out
    assert "relay verify: 2 of 2 negentropy indexes agree with the events" in out


def test_verify_finds_a_missing_item_and_a_wrong_node_sum(config, capsys):
    """An item deleted from the full-set index and a bucket sum changed in the kind 0 index: exit 1, both named."""
    tamper(config, "DELETE FROM neg_items WHERE (filter_no, created_at, id) IN "
           "(SELECT filter_no, created_at, id FROM neg_items WHERE filter_no = 1 LIMIT 1)")
    tamper(config, "UPDATE neg_nodes SET s3 = s3 + 1 WHERE filter_no = 2 AND level = 1")
    assert run_verify(config) == 1
    out = capsys.readouterr().out
    assert "negentropy index {}: 1 events missing, 0 items without an event, 2 node problems" in out
    assert 'negentropy index {"kinds":[0]}: 0 events missing, 0 items without an event' in out
    assert "count/sums disagree with its items" in out
    assert "relay verify: 0 of 2 negentropy indexes agree with the events" in out


def test_verify_reports_an_index_not_built_for_the_configuration(config, capsys, tmp_path):
    """A configured filter with no stored index (the relay not restarted since) is a problem, not a pass."""
    changed = make_config(tmp_path, negentropy={"filters": [INDEXED, {"kinds": [3]}]})
    assert run_verify(changed) == 1
    assert 'negentropy index {"kinds":[3]}: not built for this configuration' in capsys.readouterr().out
