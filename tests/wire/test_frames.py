"""The server's own text-frame headers against websockets' frame serializer (RFC 6455 section 5.2)."""

from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode

from relay.wire.websocket import text_frame_header


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65_535, 65_536, 1_048_576])
def test_text_frame_header_matches_websockets(size):
    """Header + payload is byte for byte the frame websockets builds for an unmasked final text frame."""
    payload = b"a" * size
    assert text_frame_header(size) + payload == Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[])
