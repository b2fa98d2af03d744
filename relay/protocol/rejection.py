"""One rejection type carrying a NIP-01 machine-readable prefix (NIP-01, NIP-42)."""

from __future__ import annotations

PREFIXES = frozenset(
    {
        "invalid",
        "duplicate",
        "blocked",
        "rate-limited",
        "pow",
        "restricted",
        "mute",
        "error",
        "auth-required",
    }
)


class Rejection(Exception):
    """A refusal to send to the client as `"<prefix>: <reason>"`.

    `prefix` is one of NIP-01's standardized prefixes (`PREFIXES`);
    `str(rejection)` renders the whole machine-readable message.

    Raises:
        ValueError: for a prefix that NIP-01 does not define.
    """

    def __init__(self, prefix: str, reason: str) -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"unknown rejection prefix {prefix!r}")
        super().__init__(prefix, reason)
        self.prefix = prefix
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.prefix}: {self.reason}"


def invalid(reason: str) -> Rejection:
    """Shorthand for `Rejection("invalid", reason)`."""
    return Rejection("invalid", reason)
