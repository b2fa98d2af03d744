"""What the search index holds of one event (NIP-50): its text, and for a profile its `nip05` domain.

Kind 0 (NIP-01 metadata): the `name`, `display_name`, `about` and `nip05`
strings of the JSON content (content that is not a JSON object gives no
text); kind 30023 (NIP-23): the first `title` and `summary` tags and the
content; any other kind: the content.  CJK runs are written as bigrams
(`cjk_bigrams`, relay/protocol/search.py).  The same function feeds inserts,
deletions (contentless FTS5 deletes a row by its original values), the
rebuild, `relay verify` and live matching, so they always agree.
"""

from __future__ import annotations

import orjson

from relay.protocol.search import cjk_bigrams, domain_token

PROFILE_KIND = 0
ARTICLE_KIND = 30023
PROFILE_FIELDS = ("name", "display_name", "about", "nip05")
ARTICLE_TAGS = ("title", "summary")


def nip05_domain(nip05: str) -> str:
    """The domain of a NIP-05 identifier (`name@domain`), lowercase; a bare `domain` stands for `_@domain`.

    Unverified: the relay does not fetch `/.well-known/nostr.json`.
    """
    return nip05.rpartition("@")[2].strip().lower()


def document(kind: int, content: str, tags: list) -> tuple[str, str]:
    """(text, domain column) of an event of `kind`: the text with its CJK runs as bigrams; the domain column
    is `domain_token` of a profile's `nip05` domain, else ""."""
    text, domain = _fields(kind, content, tags)
    return cjk_bigrams(text), domain


def _fields(kind: int, content: str, tags: list) -> tuple[str, str]:
    """(text as written, domain column) of an event of `kind` (see `document`)."""
    if kind == PROFILE_KIND:
        try:
            profile = orjson.loads(content)
        except orjson.JSONDecodeError:
            return "", ""
        if type(profile) is not dict:
            return "", ""
        values = [profile[f] for f in PROFILE_FIELDS if type(profile.get(f)) is str]
        nip05 = profile.get("nip05")
        domain = nip05_domain(nip05) if type(nip05) is str else ""
        return "\n".join(values), domain_token(domain) if domain else ""
    if kind == ARTICLE_KIND:
        found = {}
        for tag in tags:
            if len(tag) > 1 and tag[0] in ARTICLE_TAGS and type(tag[1]) is str:
                found.setdefault(tag[0], tag[1])
        return "\n".join([*(found[t] for t in ARTICLE_TAGS if t in found), content]), ""
    return content, ""


def document_of_raw(raw: str | bytes) -> tuple[str, str]:
    """`document` of an event stored as canonical JSON (`events.raw`)."""
    obj = orjson.loads(raw)
    return document(obj["kind"], obj["content"], obj["tags"])
