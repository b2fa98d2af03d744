"""NIP-50 search text: words, phrases, prefixes and extensions parsed, and every user string quoted for FTS5."""

from __future__ import annotations

import re

import pytest

from relay.protocol.filters import parse_filter
from relay.protocol.rejection import Rejection
from relay.protocol.search import SearchQuery, Term, cjk_bigrams, domain_token, parse_search


def test_words_phrases_and_prefixes():
    """Bare words, "quoted phrases" (an unclosed one runs to the end) and words ending in * are terms."""
    q = parse_search('bitcoin "lightning network" zap* "open end', 100)
    assert q.terms == (Term("bitcoin"), Term("lightning network"), Term("zap", prefix=True), Term("open end"))
    assert q.domains == () and q.ignored == ()


def test_extensions_are_taken_out_of_the_words():
    """NIP-50 key:value extensions leave the words; domain: is kept (lowercase), the others ignored."""
    q = parse_search("nostr domain:Primal.NET include:spam language:en sentiment:positive nsfw:false", 200)
    assert q.terms == (Term("nostr"),)
    assert q.domains == ("primal.net",)
    assert q.ignored == (("include", "spam"), ("language", "en"), ("sentiment", "positive"), ("nsfw", "false"))


@pytest.mark.parametrize("text", ["10:30", "https://example.com/a?b=c", "foo:bar", '"domain:x.com"'])
def test_other_colons_are_words(text):
    """Only the NIP-50 keys are extensions: times, URLs, other keys and quoted text stay words."""
    q = parse_search(text, 100)
    assert q.domains == () and len(q.terms) == 1


def test_an_extension_without_a_value_is_ignored():
    """`domain:` (or `include:`) with nothing after the colon is no word "domain": it is taken out, and a query
    of nothing else is empty."""
    q = parse_search("nostr domain: include:", 100)
    assert (q.terms, q.domains, q.ignored) == ((Term("nostr"),), (), ())
    with pytest.raises(Rejection):
        parse_search("domain:", 100)


def test_several_domains_match_any_of_them():
    """`domain:a domain:b` asks for profiles at a or at b (the last one alone was kept), each domain once."""
    q = parse_search("domain:A.com nostr domain:b.com domain:a.com", 100)
    assert q.domains == ("a.com", "b.com")
    a, b = domain_token("a.com"), domain_token("b.com")
    assert q.match_expression() == f'text : ("nostr") AND domain : ("{a}" OR "{b}")'


@pytest.mark.parametrize("text", ["10:30", "C++", "bitcoin OR", "NEAR(", 'a"b', "AND NOT *", "col:umn", "^x", "{x}",
                                  '"unclosed', "-minus", "a\x00b"])
def test_user_text_is_only_ever_inside_quotes(text):
    """Outside the double-quoted strings, a MATCH expression holds only our own syntax."""
    expression = parse_search(text, 100).match_expression()
    outside = re.sub(r'"(?:[^"]|"")*"', "", expression)
    assert re.fullmatch(r'text : \(( \*| )*\)', outside), expression


def test_domain_is_one_token_of_letters_and_digits():
    """The domain's token survives the tokenizer whole, so a subdomain or a longer name is another token."""
    token = domain_token("Example.com")
    assert token.isalnum() and token == domain_token("example.com")
    assert token not in (domain_token("sub.example.com"), domain_token("example.co"))
    assert parse_search("domain:example.com", 100).match_expression() == f'domain : ("{token}")'


def test_words_without_a_letter_or_digit_are_dropped():
    """`(`, `'`, `%` or an emoji tokenize to nothing in FTS5 (unicode61 keeps L*, N*, Co): they are no words, so
    alone they make an empty query, and beside a word they change nothing."""
    assert parse_search("bitcoin \U0001f600 ( '", 100).terms == (Term("bitcoin"),)
    for text in ("(", "\U0001f600", "' % _ \\", '"( )"', "domain:*"):
        with pytest.raises(Rejection):
            parse_search(text, 100)


@pytest.mark.parametrize("value", ["", "   ", "language:en", "***", 5, None, ["x"], "x" * 101, "é" * 51, "\ud800"])
def test_empty_long_or_non_text_search_is_invalid(value):
    """An empty query (no words once extensions are out), one over max_bytes (UTF-8), a non-string or a lone
    surrogate: "invalid:"."""
    with pytest.raises(Rejection) as err:
        parse_search(value, 100)
    assert err.value.prefix == "invalid"


def test_a_filter_carries_its_search():
    """parse_filter keeps the parsed search beside the other keys and applies max_search_bytes."""
    f = parse_filter({"search": "nostr", "kinds": [1]}, max_search_bytes=10)
    assert f.search == SearchQuery((Term("nostr"),)) and f.kinds == {1}
    with pytest.raises(Rejection):
        parse_filter({"search": "x" * 11}, max_search_bytes=10)


@pytest.mark.parametrize("text, tokens", [
    ("日本語です", ["日本", "本語", "語で", "です", "す"]),
    ("Bitcoinは比特币です", ["Bitcoin", "は比", "比特", "特币", "币で", "です", "す"]),
    ("한국어를 배우다", ["한국", "국어", "어를", "를", "배우", "우다", "다"]),
    ("猫、ネコ。", ["猫", "、", "ネコ", "コ", "。"]),
])
def test_a_cjk_run_is_indexed_as_its_bigrams_and_its_last_character(text, tokens):
    """Each run of Han, kana or Hangul becomes one token per character: that character and the next, the last
    alone; the other text around it is left as it is."""
    assert cjk_bigrams(text).split() == tokens


@pytest.mark.parametrize("text", ["cat concatenate", "café 10:30 C++", "Ünïcödé naïve", "ＢＩＴ Ω", ""])
def test_text_without_cjk_is_indexed_as_it_is(text):
    """Latin, Greek and fullwidth Latin keep unicode61's words: no word is split, so word boundaries hold."""
    assert cjk_bigrams(text) == text


@pytest.mark.parametrize("search, expression", [
    ("日本語", '"日本 本語"'),
    ("日本", '"日本"'),
    ("猫", '"猫" *'),
    ("比特币Bitcoin", '"比特 特币 币 Bitcoin"'),
    ("Bitcoinは", '"Bitcoin は" *'),
    ("Bitcoinは比特*", '"Bitcoin は比 比特" *'),
    ('"日本語 です"', '"日本 本語 語 です"'),
    ("日本語。", '"日本 本語"'),
])
def test_a_cjk_word_is_searched_as_the_phrase_of_its_bigrams(search, expression):
    """A CJK run in a query is the phrase of its bigrams, so it is found anywhere inside an indexed run; a run
    followed by more of the term keeps its last character, as the index does; one CJK character ending the term
    is a prefix, of a bigram or of a run's last character."""
    assert parse_search(search, 100).match_expression() == f"text : ({expression})"
