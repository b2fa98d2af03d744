"""The built-in projectors, shipped in `config/relay.toml` (and equal to it: tests check it).

    profiles      kind 0      one row per author: name, display_name, about, picture, nip05, lud16 (JSON content)
    follows       kind 3      one row per followed pubkey (`p` tag): relay hint, petname
    relay_lists   kind 10002  one row per relay (`r` tag, NIP-65): marker "read" / "write", NULL for both
    articles      kind 30023  one row per (author, d): title, summary, image, published_at (NIP-23 tags)
"""

from __future__ import annotations

from relay.store.projectors.spec import FieldSpec, ProjectorSpec


def _text(name: str, source: str, required: bool = False) -> FieldSpec:
    return FieldSpec(name, "TEXT", source, required)


PROFILES = ProjectorSpec(
    table="profiles", kind=0, primary_key=("pubkey",), indexes=(("nip05",),),
    fields=(
        _text("pubkey", "pubkey"),
        _text("name", "content.name"),
        _text("display_name", "content.display_name"),
        _text("about", "content.about"),
        _text("picture", "content.picture"),
        _text("nip05", "content.nip05"),
        _text("lud16", "content.lud16"),
    ),
)

FOLLOWS = ProjectorSpec(
    # No index on `followed`: "who follows X" is served by the store's tag index (REQ {"kinds": [3], "#p": [X]});
    # add indexes = [["followed"]] to query it here (about 6 µs more per follow row written).
    table="follows", kind=3, primary_key=("pubkey", "followed"), row_per_tag="p",
    fields=(
        _text("pubkey", "pubkey"),
        _text("followed", "tag:p:1", required=True),
        _text("relay", "tag:p:2"),
        _text("petname", "tag:p:3"),
    ),
)

RELAY_LISTS = ProjectorSpec(
    table="relay_lists", kind=10002, primary_key=("pubkey", "url"), row_per_tag="r", indexes=(("url",),),
    fields=(
        _text("pubkey", "pubkey"),
        _text("url", "tag:r:1", required=True),
        _text("marker", "tag:r:2"),
    ),
)

ARTICLES = ProjectorSpec(
    table="articles", kind=30023, primary_key=("pubkey", "d"), indexes=(("published_at",),),
    fields=(
        _text("pubkey", "pubkey"),
        _text("d", "tag:d"),
        _text("title", "tag:title"),
        _text("summary", "tag:summary"),
        _text("image", "tag:image"),
        FieldSpec("published_at", "INTEGER", "tag:published_at"),
    ),
)

BUILTIN_PROJECTORS: tuple[ProjectorSpec, ...] = (PROFILES, FOLLOWS, RELAY_LISTS, ARTICLES)


def builtin_projectors() -> tuple[ProjectorSpec, ...]:
    """The built-in projector specs: the default of `Config.projectors`."""
    return BUILTIN_PROJECTORS
