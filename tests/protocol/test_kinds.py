"""Kind names for people (relay/protocol/kinds.py)."""

from __future__ import annotations

from relay.protocol.kinds import KIND_NAMES, kind_label


def test_common_kinds_are_shown_with_their_name_others_by_number():
    """"1 (note)", "0 (metadata)", "9735 (zap)", "30023 (long-form)"; a kind without a name is its number alone."""
    assert [kind_label(k) for k in (0, 1, 3, 5, 6, 7, 1984, 9735, 10002, 30023, 27235, 30803)] == [
        "0 (metadata)", "1 (note)", "3 (follows)", "5 (deletion)", "6 (repost)", "7 (reaction)", "1984 (report)",
        "9735 (zap)", "10002 (relay list)", "30023 (long-form)", "27235 (HTTP auth)", "30803 (coverage claim)"]
    assert kind_label(31234) == "31234" and 31234 not in KIND_NAMES
