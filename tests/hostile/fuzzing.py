"""Hypothesis strategies for the parser fuzz tests: random JSON, hostile scalars, mutations of real messages.

Every fuzz test runs `examples(n)` examples: `n` in CI, or `FUZZ_EXAMPLES`
when that environment variable is set (see bench/fuzz.py for long runs).
"""

from __future__ import annotations

import json
import os
from functools import cache

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.helpers import REAL_EVENTS

SURROGATE_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)  # lone surrogates included
"""Strings with any code point, lone surrogates and NUL included."""

NASTY_NUMBERS = st.sampled_from([
    0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**63) - 1, 10**400,
    1.0, -0.0, 0.5, 1e400, -1e400, float("nan"), 1e308, True, False,
])
"""Numbers at and past the int64/uint64 edges, integral floats, infinities, NaN, booleans."""

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), NASTY_NUMBERS, SURROGATE_TEXT,
                     st.text(max_size=20), st.sampled_from(["", "0" * 64, "A" * 64, "g" * 64, "EVENT", "REQ"]))

JSON_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.one_of(st.sampled_from(["ids", "authors", "kinds", "since", "until", "limit", "#e", "#p", "#d",
                                   "id", "pubkey", "created_at", "kind", "tags", "content", "sig"]),
                  SURROGATE_TEXT), children, max_size=5),
    max_leaves=25,
)
"""Any JSON-like value (and NaN/Infinity, which the stdlib decoder accepts); dict keys lean to NIP-01 ones."""


def examples(ci: int) -> settings:
    """Hypothesis settings running `ci` examples, or `FUZZ_EXAMPLES` of them when set; no deadline."""
    return settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", ci)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@cache
def real_events(n: int = 300) -> tuple[dict, ...]:
    """The first `n` real events of /work/shared/data (valid ids and signatures)."""
    with open(REAL_EVENTS, encoding="utf-8") as f:
        return tuple(json.loads(next(f)) for _ in range(n))


def dumps(value: object) -> str:
    """JSON text of `value` as a client could send it (NaN/Infinity and lone surrogates left as they are)."""
    return json.dumps(value, ensure_ascii=False)


_EVENT_KEYS = st.sampled_from(["id", "pubkey", "created_at", "kind", "tags", "content", "sig", "extra"])
_EVENT_ACTIONS = st.sampled_from(["replace", "delete", "nasty", "tag"])
_NASTY = NASTY_NUMBERS | SURROGATE_TEXT
_TAG = st.lists(JSON_VALUES, max_size=3)


@st.composite
def mutated_event(draw) -> dict:
    """A real event with one to three fields replaced by random values, removed, or added."""
    event = dict(draw(st.sampled_from(real_events())))
    for _ in range(draw(st.integers(1, 3))):
        key, action = draw(_EVENT_KEYS), draw(_EVENT_ACTIONS)
        if action == "delete":
            event.pop(key, None)
        elif action == "nasty":
            event[key] = draw(_NASTY)
        elif action == "tag":
            tags = event.get("tags")
            event["tags"] = [*(tags if type(tags) is list else []), draw(_TAG)]
        else:
            event[key] = draw(JSON_VALUES)
    return event


_TEXT_ACTIONS = st.sampled_from(["insert", "delete", "replace", "cut", "double"])
_PIECES = st.sampled_from(['"', "[", "]", "{", "}", ",", ":", "\\", "\\u", "\\ud800", "\x00", "-", "1e999", "9" * 30,
                           "null", "NaN", "\ud800", "é"]) | SURROGATE_TEXT


@st.composite
def mutated_text(draw, base: st.SearchStrategy[str]) -> str:
    """`base` text with characters flipped, inserted, deleted, or the text cut or repeated."""
    text = draw(base)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        action, piece = draw(_TEXT_ACTIONS), draw(_PIECES)
        if action == "insert":
            text = text[:pos] + piece + text[pos:]
        elif action == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 8)):]
        elif action == "replace":
            text = text[:pos] + piece + text[pos + len(piece):]
        elif action == "cut":
            text = text[:pos]
        else:
            text = text[:pos] + text
    return text
