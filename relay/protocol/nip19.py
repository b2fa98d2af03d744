"""NIP-19 `npub1...` and `note1...`: bech32 (BIP-173) of a 32-byte pubkey or event id, decoded to 64 lowercase hex.

Only the two bare-key forms: the TLV forms (nprofile, nevent, naddr) carry more than a key.
"""

from __future__ import annotations

_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_GENERATOR = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
MAX_BECH32_CHARS = 90  # BIP-173


def _polymod(values: list[int]) -> int:
    check = 1
    for value in values:
        top = check >> 25
        check = (check & 0x1FFFFFF) << 5 ^ value
        for i, generator in enumerate(_GENERATOR):
            check ^= generator if (top >> i) & 1 else 0
    return check


def decode_bech32(text: str) -> tuple[str, bytes]:
    """(the human-readable part, the data bytes) of a BIP-173 bech32 string.

    Raises:
        ValueError: not bech32 (mixed case, a character outside the charset, a bad checksum or padding).
    """
    if not text.isascii() or len(text) > MAX_BECH32_CHARS or (text.lower() != text and text.upper() != text):
        raise ValueError("not bech32 (ASCII, one case, at most 90 characters)")
    text = text.lower()
    split = text.rfind("1")
    if split < 1 or split + 7 > len(text) or any(not 33 <= ord(c) <= 126 for c in text[:split]):
        raise ValueError("not bech32 (no human-readable part, or too short)")
    hrp, data = text[:split], text[split + 1:]
    if any(c not in _CHARSET for c in data):
        raise ValueError("not bech32 (a character outside its alphabet)")
    values = [_CHARSET.index(c) for c in data]
    if _polymod([ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp] + values) != 1:
        raise ValueError("bad bech32 checksum")
    acc, bits, out = 0, 0, bytearray()
    for value in values[:-6]:  # 5-bit groups to bytes; the last 6 are the checksum
        acc, bits = acc << 5 | value, bits + 5
        if bits >= 8:
            bits -= 8
            out.append(acc >> bits & 0xFF)
    if bits >= 5 or acc & ((1 << bits) - 1):
        raise ValueError("bad bech32 padding")
    return hrp, bytes(out)


def key_hex(text: str, hrp: str) -> str:
    """The 64-hex key of `text`, an `npub1...` (hrp "npub") or `note1...` (hrp "note").

    Raises:
        ValueError: not bech32, another prefix, or not 32 bytes.
    """
    found, data = decode_bech32(text)
    if found != hrp or len(data) != 32:
        raise ValueError(f"not an {hrp}1... of 32 bytes")
    return data.hex()
