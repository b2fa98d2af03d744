"""The shipped policies (relay/policies/builtin.py), on parsed events, without a relay."""

from __future__ import annotations

import os
import time

import pytest

from relay.ingest import IMPORT
from relay.policies import ACCEPT
from relay.policies.builtin import author_rate, difficulty, max_size, min_pow, pubkey_list
from relay.protocol.event import EventLimits, parse_event
from tests.helpers import Keys


def parsed(keys: Keys, **fields):
    return parse_event(keys.sign(**fields), EventLimits(), time.time())


def mined(keys: Keys, bits: int, commit: int | None = None):
    """An event whose id has at least `bits` leading zero bits (NIP-13), committing to `commit` (default bits)."""
    for nonce in range(1_000_000):
        event = parsed(keys, tags=[["nonce", str(nonce), str(bits if commit is None else commit)]], created_at=1)
        if difficulty_of(event.id) >= bits:
            return event
    raise AssertionError("no nonce found")


def difficulty_of(event_id: str) -> int:
    return 256 - int(event_id, 16).bit_length()


def test_pubkey_list_allows_and_denies_from_files_read_again_when_changed(tmp_path, alice: Keys, bob: Keys):
    """Deny wins; only allowed authors pass; an edited file applies without a restart (within a second)."""
    allow, deny = tmp_path / "allow.txt", tmp_path / "deny.txt"
    allow.write_text(f"# friends\n{alice.pubkey}\n{bob.pubkey}  # bob\n")
    deny.write_text("")
    check = pubkey_list(allow_file=str(allow), deny_file=str(deny))
    carol = Keys(3)
    assert check(parsed(alice), IMPORT) == ACCEPT
    assert check(parsed(carol), IMPORT).message == "blocked: this pubkey is not on the allow list"
    deny.write_text(bob.pubkey + "\n")
    os.utime(deny, (time.time() + 5, time.time() + 5))  # a new mtime even on a coarse clock
    time.sleep(1.05)
    assert check(parsed(bob), IMPORT).message == "blocked: this pubkey may not publish here"


def test_pubkey_list_refuses_a_bad_file_or_no_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("not-a-pubkey\n")
    with pytest.raises(ValueError, match="bad.txt:1"):
        pubkey_list(deny_file=str(bad))
    with pytest.raises(ValueError):
        pubkey_list()
    with pytest.raises(OSError):
        pubkey_list(allow_file=str(tmp_path / "missing.txt"))


def test_max_size_bounds_each_kind_and_the_others(alice: Keys):
    check = max_size({"0": 500}, default_bytes=600)  # an event without content is about 340 bytes
    assert check(parsed(alice, kind=0, content="x" * 10), IMPORT) == ACCEPT
    assert check(parsed(alice, kind=0, content="x" * 200), IMPORT).message == \
        "blocked: events of kind 0 are limited to 500 bytes"
    assert check(parsed(alice, kind=1, content="x" * 200), IMPORT) == ACCEPT
    assert check(parsed(alice, kind=1, content="x" * 300), IMPORT).message.startswith("blocked: events of kind 1")
    assert max_size({"1": 0})(parsed(alice, content="x" * 5000), IMPORT) == ACCEPT  # 0: no bound
    for bad in ({"one": 10}, {"70000": 10}, {"1": -1}):
        with pytest.raises(ValueError):
            max_size(bad)


def test_min_pow_counts_leading_zero_bits_capped_by_the_committed_target(alice: Keys):
    """NIP-13: enough zeros pass; too few get "pow:"; zeros beyond a lower committed target do not count."""
    check = min_pow(bits=8)
    event = mined(alice, 8)
    assert difficulty(event) >= 8 and check(event, IMPORT) == ACCEPT
    assert check(parsed(alice, content="no work"), IMPORT).message.startswith("pow: difficulty ")
    lucky = mined(alice, 8, commit=4)
    assert difficulty(lucky) == 4 and check(lucky, IMPORT).message == "pow: difficulty 4 is less than 8"
    assert min_pow(bits=8, kinds=[7])(parsed(alice, content="kind 1 is free"), IMPORT) == ACCEPT
    with pytest.raises(ValueError):
        min_pow(bits=0)


def test_author_rate_limits_each_author_alone_and_refills(alice: Keys, bob: Keys):
    check = author_rate(events_per_minute=600, burst=2)  # 10 per second after a burst of 2
    assert [check(parsed(alice), IMPORT).action for _ in range(3)] == ["accept", "accept", "reject"]
    assert check(parsed(alice), IMPORT).message == "rate-limited: this author publishes too fast, slow down"
    assert check(parsed(bob), IMPORT) == ACCEPT
    time.sleep(0.15)
    assert check(parsed(alice), IMPORT) == ACCEPT


def test_author_rate_keeps_at_most_max_authors(alice: Keys, bob: Keys):
    """The least recently seen author's bucket is dropped: it starts again full."""
    check = author_rate(events_per_minute=1, burst=1, max_authors=1)
    assert check(parsed(alice), IMPORT) == ACCEPT
    assert check(parsed(bob), IMPORT) == ACCEPT  # alice's bucket dropped
    assert check(parsed(alice), IMPORT) == ACCEPT
    assert check(parsed(alice), IMPORT).action == "reject"
