"""NIP-11 relay information document, built from the configuration."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from relay.config import Config
from relay.protocol.information import SOFTWARE, software_version
from relay.protocol.rules import KindRules

SUPPORTED_NIPS = [1, 9, 11, 40, 42, 45, 62, 70]


MIN_POW_POLICY = "relay.policies.builtin:min_pow"


def _write_limitation(config: Config, kinds: KindRules | None) -> dict:
    """The NIP-11 `limitation` fields that follow the write rules in effect: `restricted_writes` when not every
    client may publish every event (`[auth] write`, the kinds of `[auth]` and NIP-86 together: `kinds`, None
    for `[auth]`'s alone, or a `[[policies]]` entry for clients), `min_pow_difficulty` (NIP-13) when the
    shipped `min_pow` policy applies to every kind from clients.  Bans of given pubkeys or events are no
    condition a client could meet: they leave `restricted_writes` alone."""
    auth = config.auth
    kinds = kinds or KindRules.of(auth.allow_kinds, auth.deny_kinds)
    client_policies = [p for p in config.policies if "client" in p.sources]
    fields: dict = {"restricted_writes": auth.write != "all" or kinds.allow is not None or bool(kinds.deny)
                    or bool(client_policies)}
    pow_bits = [p.options.get("bits", 20) for p in client_policies
                if p.call == MIN_POW_POLICY and not p.options.get("kinds")]
    if pow_bits:
        fields["min_pow_difficulty"] = max(pow_bits)
    return fields


def document(config: Config, overrides: Mapping[str, str] | None = None, kinds: KindRules | None = None) -> bytes:
    """The NIP-11 JSON document: identity from `[info]`, `limitation` from `[limits]` and the write rules in
    effect (`kinds`: `[auth]`'s and NIP-86's together; see `_write_limitation`); `overrides` are NIP-86's name,
    description and icon, which win over `[info]`."""
    info, limits, auth = config.info, config.limits, config.auth
    overrides = overrides or {}
    extra = ([77] if config.negentropy.enabled else []) + ([86] if config.admin.pubkeys else [])  # NEG-*, NIP-86
    extra += [50] if config.search.enabled else []  # NIP-50 search
    doc = {
        "name": overrides.get("name", info.name),
        "description": overrides.get("description", info.description),
        "supported_nips": sorted(SUPPORTED_NIPS + extra),
        "software": SOFTWARE,
        "version": software_version(),
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
            **_write_limitation(config, kinds),
        },
    }
    if "icon" in overrides:
        doc["icon"] = overrides["icon"]
    if info.pubkey:
        doc["pubkey"] = info.pubkey
    if info.contact:
        doc["contact"] = info.contact
    return orjson.dumps(doc)
