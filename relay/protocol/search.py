"""NIP-50 search queries: the user's text parsed into terms, and the FTS5 query built from them.

How this works: `parse_search` splits the text on whitespace into words,
`"quoted phrases"` and `prefix*` words, and takes the NIP-50 `key:value`
extensions (`include:`, `domain:`, `language:`, `sentiment:`, `nsfw:`) out of
the words; one with an empty value (`domain:`) is taken out and ignored.
`SearchQuery.match_expression` then writes an SQLite FTS5 query in which
every piece of user text is inside double quotes, so no user string
(`10:30`, `C++`, `bitcoin OR`, `NEAR(`) is read as FTS5 syntax: the relay
never passes user text to FTS5 as syntax.  All terms must match (FTS5's
implicit AND); a term FTS5's tokenizer finds no token in (`:)`) constrains
nothing, and a query made of such terms only matches nothing.  `domain:` is
applied through a token of the kind-0 `nip05` domain (`domain_token`) kept
in the index's `domain` column; several `domain:` match a profile at any of
them (a profile has one domain: all of them would match nothing); the other
extensions are ignored.

CJK: FTS5's unicode61 keeps a run of Han, kana or Hangul letters as one
token, so a word inside a sentence could not be found.  `cjk_bigrams`
writes each such run, in the indexed text, as one token per character:
that character and the next (a bigram), the run's last character alone;
`Term.quoted` writes a CJK run of the query as the phrase of its bigrams,
found anywhere inside an indexed run.  A run that the term goes on after
keeps its last character, as in the index; a single CJK character ending
the term matches as a prefix (the first of a bigram, or a last character).
Text outside CJK runs is left to unicode61 as it is, so Latin words keep
their boundaries.
Pure: no I/O.  Source: NIP-50.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from relay.protocol.rejection import invalid

EXTENSIONS = frozenset({"include", "domain", "language", "sentiment", "nsfw"})
"""NIP-50's `key:value` extensions: taken out of the words; only `domain` is applied."""

TEXT_COLUMN = "text"
DOMAIN_COLUMN = "domain"
"""The columns of the search index (relay/store/search/): the words, and the `nip05` domain's token."""

CJK_RUN = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3005, 0x3007), (0x3021, 0x3029), (0x3031, 0x3035), (0x3038, 0x303C),  # 々 〆 〇, Hangzhou numerals, kana marks
    (0x3041, 0x3096), (0x309D, 0x309F), (0x30A1, 0x30FA), (0x30FC, 0x30FF),  # Hiragana, Katakana (with ー, not ・)
    (0x3105, 0x312F), (0x3131, 0x318E), (0x31A0, 0x31BF), (0x31F0, 0x31FF),  # Bopomofo, Hangul compat, Katakana ext
    (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),  # CJK ideographs: extension A, unified, compatibility
    (0xA960, 0xA97C), (0xAC00, 0xD7A3), (0xD7B0, 0xD7FB),  # Hangul Jamo extended A, syllables, extended B
    (0xFF66, 0xFF9F), (0xFFA0, 0xFFDC),  # halfwidth Katakana and Hangul
    (0x1B000, 0x1B16F), (0x20000, 0x2FA1F), (0x30000, 0x323AF),  # kana supplement, ideograph extensions B-H
)) + "]+")
"""A run of CJK letters (Unicode categories L* and N* of those blocks, no punctuation): a word boundary for
unicode61 only where a separator or another script is, so it is cut into bigrams (see the module docstring)."""
CJK_SEGMENTATION = "cjk bigrams 1"
"""The version of `cjk_bigrams`: part of the search index's layout, so a change rebuilds stored indexes."""


@dataclass(frozen=True, slots=True)
class Term:
    """One word or phrase to match: `text` as the user wrote it (unquoted); `prefix`: ends with `*`."""

    text: str
    prefix: bool = False

    def quoted(self) -> str:
        """The term as an FTS5 string: in double quotes (inner ones doubled), `*` after it for a prefix.

        Its CJK runs are written as tokens of the index (`_cjk_phrase`), which
        may make a prefix of a term that ends in one CJK character.  NUL would
        end FTS5's reading of the query: it becomes a space, which separates
        tokens as NUL does in the indexed text.
        """
        phrase, open_end = _cjk_phrase(self.text)
        prefix = self.prefix or open_end
        return '"' + phrase.replace('"', '""').replace("\x00", " ") + '"' + (" *" if prefix else "")


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A parsed NIP-50 `search` value.

    `terms`: words and phrases, all of which must match; `domains`: the
    lowercase `domain:` values (kind-0 `nip05` domains), in order and each
    once, any of which may match (none: no domain asked);
    `ignored`: the other extensions as (key, value), in order.
    """

    terms: tuple[Term, ...]
    domains: tuple[str, ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()

    def match_expression(self) -> str:
        """The FTS5 MATCH string: the terms in the text column, ANDed with any one of the domains' tokens."""
        parts = []
        if self.terms:
            parts.append(f"{TEXT_COLUMN} : (" + " ".join(t.quoted() for t in self.terms) + ")")
        if self.domains:
            tokens = " OR ".join(f'"{domain_token(domain)}"' for domain in self.domains)
            parts.append(f"{DOMAIN_COLUMN} : ({tokens})")
        return " AND ".join(parts)


def domain_token(domain: str) -> str:
    """The one FTS5 token that stands for `domain` (lowercased) in the index's domain column.

    Hex of its UTF-8: letters and digits only, so the tokenizer keeps it
    whole and `domain:example.com` never matches `sub.example.com`.
    """
    return "d" + domain.lower().encode().hex()


def _grams(run: str) -> list[str]:
    """One token per character of the CJK `run`: it and the next one, the last character alone."""
    return [run[i:i + 2] for i in range(len(run))]


def cjk_bigrams(text: str) -> str:
    """`text` as the search index is given it: each CJK run replaced by its `_grams`, separated by spaces.

    "Bitcoinは比特币" becomes "Bitcoin は比 比特 特币 币 ": the other text is
    left as it is.
    """
    return CJK_RUN.sub(lambda run: " " + " ".join(_grams(run[0])) + " ", text)


def _cjk_phrase(text: str) -> tuple[str, bool]:
    """(`text` of a query term with its CJK runs as tokens of the index, whether its last token is a prefix).

    A run followed by more of the term ends there in the indexed text too: all
    its `_grams`.  The run ending the term may go on in the indexed text: its
    bigrams only, or, for a single character, that character as a prefix.
    """
    parts, end, open_end = [], 0, False
    for run in CJK_RUN.finditer(text):
        grams = _grams(run[0])
        if not _searchable(text[run.end():]):
            grams, open_end = grams[:-1] or grams, len(grams) == 1
        parts += [text[end:run.start()], *grams]
        end = run.end()
    return " ".join(p.strip() for p in [*parts, text[end:]] if _searchable(p)), open_end


def _split(text: str):
    """Yield (piece, quoted) in order: quoted phrases (an unclosed quote runs to the end) and bare words."""
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text[i] == '"':
            end = text.find('"', i + 1)
            end = n if end < 0 else end
            yield text[i + 1:end], True
            i = end + 1
        else:
            start = i
            while i < n and not text[i].isspace():
                i += 1
            yield text[start:i], False


def _searchable(piece: str) -> bool:
    """True when `piece` holds a token character of FTS5's unicode61 tokenizer (its default categories
    L*, N* and Co); anything else (`(`, `'`, an emoji) is all separators and could never match."""
    return any((category := unicodedata.category(c))[0] in "LN" or category == "Co" for c in piece)


def parse_search(value: object, max_bytes: int) -> SearchQuery:
    """Parse the `search` value of a filter (NIP-50): words, `"phrases"`, `prefix*`, `key:value` extensions.

    `max_bytes` bounds the UTF-8 length of the text.  A query is empty when
    no word or phrase and no `domain:` remains once extensions are taken out
    (an extension with an empty value, `domain:`, is taken out and ignored)
    and words with no letter or digit (`(`, an emoji: separators to FTS5) are
    dropped.

    Raises:
        Rejection: "invalid:" when `value` is not a string, is empty, is over
        `max_bytes`, or holds a lone surrogate.
    """
    if type(value) is not str:
        raise invalid("search must be a string")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise invalid("string holds a lone surrogate (not valid UTF-8)") from None
    if size > max_bytes:
        raise invalid(f"search is longer than {max_bytes} bytes")
    terms, domains, ignored = [], {}, []
    for piece, quoted in _split(value):
        key, colon, rest = piece.partition(":")
        if not quoted and colon and key.lower() in EXTENSIONS:
            if not rest:
                continue  # no value: nothing to apply, and not the word "domain" either
            if key.lower() == "domain":
                if _searchable(rest):  # `domain:*` names no domain
                    domains[rest.lower()] = None
            else:
                ignored.append((key.lower(), rest))
            continue
        prefix = not quoted and piece.endswith("*")
        piece = piece.rstrip("*") if prefix else piece
        if _searchable(piece):
            terms.append(Term(piece, prefix))
    if not terms and not domains:
        raise invalid("search is empty (no words)")
    return SearchQuery(tuple(terms), tuple(domains), tuple(ignored))
