"""NIP-11 relay information: the name this project's relays give as `software`, and what it tells a peer."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SOFTWARE = "relay"
"""NIP-11 `software` of this project's relays."""


def software_version() -> str:
    """NIP-11 `version`: the installed package's (pyproject.toml), "0" when it runs uninstalled."""
    try:
        return version(SOFTWARE)
    except PackageNotFoundError:
        return "0"


def keeps_deletion_marks(document: object) -> bool:
    """True when a NIP-11 document (parsed JSON) is one of this project's relays.

    They refuse a deleted event sent again (NIP-09) and yet raise its
    coordinate's high-water mark (docs/architecture.md, invariant 5), so a deleted
    version may be sent to them as evidence (relay/store/evidence.py); a relay
    that might store it would serve a deleted event again.
    """
    return isinstance(document, dict) and document.get("software") == SOFTWARE
