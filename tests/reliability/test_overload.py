"""Overload soak: 1,000 connections to one `relay serve` (holders of 20 subscriptions, slow readers,
non-readers, full-speed publishers); memory stays within what the configured queues allow, non-readers
are disconnected and counted, readers that keep up get everything, and every acknowledged event is
served afterwards (tests/reliability/overload.py)."""

from __future__ import annotations

from relay.config import load_config
from tests.reliability.overload import OVERLOAD_TOML, Plan, raise_open_files_limit, rss_bound, soak
from tests.served import Served

PLAN = Plan()
SPARE_FILES = 200  # the relay's and this process's own files besides the sockets


async def test_thousand_connections_stay_bounded_and_lose_nothing(tmp_path):
    """1,000 connections: peak RSS < rss_bound(config), exactly the non-readers dropped and counted, nothing lost."""
    reason = raise_open_files_limit(PLAN.connections + SPARE_FILES)  # the relay subprocess inherits it
    assert reason is None, reason  # without the descriptors the soak proves nothing: fail, never skip
    config_path, db = tmp_path / "relay.toml", tmp_path / "relay.db"
    config_path.write_text(OVERLOAD_TOML, encoding="utf-8")
    config = load_config(config_path, {}, {"store": {"path": str(db)}})
    with Served(tmp_path, "--config", config_path, "--db", db, "--port", 0) as served:
        result = await soak(served, config, PLAN)
    published = result.rounds * PLAN.publishers * PLAN.events_per_round
    assert result.connections == PLAN.connections == 1000
    assert result.subscriptions == 18_050
    assert result.refused == [] and len(result.acked) == published > 0
    assert result.acked <= result.served, f"{len(result.acked - result.served)} acknowledged events not served"
    assert result.holder_events == published  # each note is tagged for one holder's live subscription
    assert result.slow_reader_frames == PLAN.slow_readers * result.slow_matches > 0
    assert result.non_readers_closed == PLAN.non_readers
    assert result.slow_readers_counted == PLAN.non_readers, result.non_reader_close_codes  # and no one else
    bound = rss_bound(config, PLAN, result.idle_rss)
    assert result.peak_rss < bound, f"peak RSS {result.peak_rss} >= bound {bound} (idle {result.idle_rss})"
