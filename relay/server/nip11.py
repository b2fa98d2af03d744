"""NIP-11 relay information document, built from the configuration."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

import orjson

from relay.config import Config
from relay.protocol.information import SOFTWARE

SUPPORTED_NIPS = [1, 9, 11, 40, 42, 45, 62, 70]


def _version() -> str:
    try:
        return version("relay")
    except PackageNotFoundError:
        return "0"


def document(config: Config, overrides: Mapping[str, str] | None = None) -> bytes:
    """The NIP-11 JSON document: identity from `[info]`, `limitation` from `[limits]`; `overrides` are NIP-86's
    name, description and icon, which win over `[info]`."""
    info, limits, auth = config.info, config.limits, config.auth
    overrides = overrides or {}
    extra = ([77] if config.negentropy.enabled else []) + ([86] if config.admin.pubkeys else [])  # NEG-*, NIP-86
    extra += [50] if config.search.enabled else []  # NIP-50 search
    doc = {
        "name": overrides.get("name", info.name),
        "description": overrides.get("description", info.description),
        "supported_nips": sorted(SUPPORTED_NIPS + extra),
        "software": SOFTWARE,
        "version": _version(),
        "limitation": {
            "max_message_length": limits.max_message_bytes,
            "max_subscriptions": limits.max_subscriptions,
            "max_filters": limits.max_filters,
            "max_limit": limits.max_limit,
            "default_limit": limits.default_limit,
            "max_event_tags": limits.max_event_tags,
            "max_content_length": limits.max_content_bytes,
            "max_subid_length": 64,
            "created_at_upper_limit": limits.max_created_at_future_seconds,
            "auth_required": auth.write == "authenticated",  # NIP-42 AUTH needed before publishing
            "payment_required": False,
            "restricted_writes": auth.restricts_writes,
        },
    }
    if "icon" in overrides:
        doc["icon"] = overrides["icon"]
    if info.pubkey:
        doc["pubkey"] = info.pubkey
    if info.contact:
        doc["contact"] = info.contact
    return orjson.dumps(doc)
