"""`relay verify` checks the NIP-77 negentropy indexes against the events table (items and node sums)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from relay.hooks import hooks
from relay.commands.projectors import run_verify
from relay.protocol.event import EventLimits, parse_event
from relay.store.store import Store
from tests.conftest import make_config
from tests.helpers import REAL_EVENTS, read_jsonl

INDEXED = {"kinds": [0]}
KINDS_0 = '{"kinds":[0]}'


@pytest.fixture
async def config(tmp_path):
    """A config indexing the full set and kind 0 (and whatever else it indexes), on 300 real events."""
    config = make_config(tmp_path, negentropy={"filters": [INDEXED]})
    store = await Store.open(config.store.path, config.store.options(1), hooks(config))
    try:
        for event in read_jsonl(REAL_EVENTS)[:300]:
            await store.submit(parse_event(event, EventLimits(), time.time()))
    finally:
        await store.close()
    return config


def tamper(config, sql: str, *params) -> None:
    conn = sqlite3.connect(config.store.path)
    with conn:
        conn.execute(sql, params)
    conn.close()


def filter_no(config, spec: str) -> int:
    conn = sqlite3.connect(config.store.path)
    try:
        return conn.execute("SELECT filter_no FROM neg_filters WHERE spec = ?", (spec,)).fetchone()[0]
    finally:
        conn.close()


def test_verify_passes_on_indexes_kept_by_the_writer(config, capsys):
    """Every index (full set, kinds 0, ...) agrees with the events: exit 0, one ok line each."""
    assert run_verify(config) == 0
    out = capsys.readouterr().out
    assert "negentropy index {}: ok, " in out
    assert f"negentropy index {KINDS_0}: ok, " in out
    assert "negentropy indexes agree with the events" in out and " do not" not in out


def test_verify_finds_an_item_without_its_event_and_a_wrong_node_sum(config, capsys):
    """A note deleted from `events` behind the index's back, and a kind 0 bucket sum changed: exit 1, both named."""
    tamper(config, "DELETE FROM events WHERE seq = (SELECT min(seq) FROM events WHERE kind = 1)")
    tamper(config, "UPDATE neg_nodes SET s3 = s3 + 1 WHERE filter_no = ? AND level = 1", filter_no(config, KINDS_0))
    assert run_verify(config) == 1
    out = capsys.readouterr().out
    assert "negentropy index {}: 0 events missing, 1 items without an event, 0 node problems" in out
    assert f"negentropy index {KINDS_0}: 0 events missing, 0 items without an event" in out
    assert "count/sums disagree with its items" in out


def test_verify_reports_an_index_not_built_for_the_configuration(config, capsys, tmp_path):
    """A configured filter with no stored index (the relay not restarted since) is a problem, not a pass."""
    changed = make_config(tmp_path, negentropy={"filters": [INDEXED, {"kinds": [3]}]})
    assert run_verify(changed) == 1
    assert 'negentropy index {"kinds":[3]}: not built for this configuration' in capsys.readouterr().out
