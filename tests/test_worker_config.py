"""`worker_config`: the relay-wide memory budgets divided among worker processes (docs/operating.md, "Limits across processes")."""

from __future__ import annotations

import dataclasses

from relay.config import Config, LimitsConfig, NegentropyConfig, worker_config


def test_each_worker_gets_its_part_of_the_relay_wide_budgets():
    """Stored results, NEG-OPEN session items and the negentropy cache are divided; per-connection and per-IP
    limits are not; 0 or 1 worker runs with the config itself."""
    config = Config()
    part = worker_config(config, 4)
    assert part.limits.max_stored_results_bytes == config.limits.max_stored_results_bytes // 4
    assert part.negentropy.max_session_items == config.negentropy.max_session_items // 4
    assert part.negentropy.cache_items == config.negentropy.cache_items // 4
    assert part.rate_limits == config.rate_limits
    assert dataclasses.replace(part.limits, max_stored_results_bytes=0) == dataclasses.replace(
        config.limits, max_stored_results_bytes=0)
    assert worker_config(config, 0) is config and worker_config(config, 1) is config


def test_a_workers_part_still_holds_one_answer():
    """A part never falls below one REQ's answer or one NEG-OPEN's events, which it could otherwise never serve."""
    config = Config(limits=LimitsConfig(max_stored_results_bytes=32 * 2**20),
                    negentropy=NegentropyConfig(max_session_items=1_500_000))
    part = worker_config(config, 8)
    assert part.limits.max_stored_results_bytes == config.limits.max_query_bytes
    assert part.negentropy.max_session_items == config.negentropy.max_sync_events
