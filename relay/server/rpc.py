"""The pieces every NIP-86 method shares: its signature, its params, and the error it answers with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relay.ingest.moderation import Moderation
from relay.protocol.event import is_hex64

Method = Callable[[Moderation, list], Awaitable[object]]
"""A NIP-86 method: `await method(moderation, params)` -> its `result` (JSON-ready); raises MethodError."""


class MethodError(ValueError):
    """A call NIP-86 answers with `error` (status 200): the message carries its NIP-01 prefix."""


def param(params: list, i: int, what: str, valid: Callable[[object], bool], default: object = None) -> object:
    """`params[i]` when `valid`; `default` when absent and not None.

    Raises:
        MethodError: "invalid:" naming the parameter and `what` it must be.
    """
    if len(params) <= i:
        if default is not None:
            return default
        raise MethodError(f"invalid: params[{i}] must be {what}")
    if not valid(params[i]):
        raise MethodError(f"invalid: params[{i}] must be {what}, got {params[i]!r:.80}")
    return params[i]


def hex64(params: list, what: str) -> str:
    """params[0]: 64 lowercase hex characters, `what` says of what (MethodError otherwise)."""
    return param(params, 0, f"a 64-character lowercase hex {what}", is_hex64)


def pubkey(params: list) -> str:
    """params[0]: a 64-hex pubkey (MethodError otherwise)."""
    return hex64(params, "pubkey")
