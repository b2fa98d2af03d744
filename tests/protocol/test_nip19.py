"""NIP-19 npub/note decoding (relay/protocol/nip19.py) against nostr-sdk's encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nostr_sdk import EventId, PublicKey

from relay.protocol.nip19 import key_hex
from tests.helpers import Keys


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32))
def test_a_note_decodes_to_the_id_nostr_sdk_encoded(raw):
    """Any 32 bytes, encoded as note1... by nostr-sdk, decode to their hex (upper case too, as BIP-173 allows)."""
    note = EventId.from_bytes(raw).to_bech32()
    assert key_hex(note, "note") == key_hex(note.upper(), "note") == raw.hex()


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=2**255))
def test_an_npub_decodes_to_the_pubkey_nostr_sdk_encoded(secret):
    """A pubkey encoded as npub1... by nostr-sdk decodes to its hex."""
    pubkey = Keys(secret).pubkey
    assert key_hex(PublicKey.parse(pubkey).to_bech32(), "npub") == pubkey


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.data())
def test_one_changed_character_is_refused(raw, data):
    """bech32's checksum finds any one substituted character; so do the other checks for any other change."""
    note = EventId.from_bytes(raw).to_bech32()
    at = data.draw(st.integers(min_value=5, max_value=len(note) - 1))
    other = data.draw(st.sampled_from([c for c in "qpzry9x8gf2tvdw0s3jn54khce6mua7l" if c != note[at]]))
    with pytest.raises(ValueError):
        key_hex(note[:at] + other + note[at + 1:], "note")


@pytest.mark.parametrize("text", ["", "note1", "npub1nothex", "Note1" + "q" * 58, "note1" + "b" * 58, "x" * 100,
                                  "note1\udcff", "1qqqqqq"])
def test_text_that_is_no_note_is_refused(text):
    """Empty, short, mixed case, a character outside the alphabet, too long, not ASCII: ValueError."""
    with pytest.raises(ValueError):
        key_hex(text, "note")


def test_an_npub_is_not_a_note():
    """The prefix must be the one asked for."""
    npub = PublicKey.parse(Keys(7).pubkey).to_bech32()
    with pytest.raises(ValueError):
        key_hex(npub, "note")
