"""The whole command line against a served database: whatever argv hypothesis draws for any subcommand, `relay`
exits 0, 1, 2 or 3 without a traceback, and the relay serving the database still answers /health and stores a
new event.  The relay is a real `relay serve --workers 0` subprocess; each command runs in-process
(`relay.cli.main`).  Left out, as they never end by design: `serve` that would start, `changes --follow`,
`import -` (stdin), `sync` to a peer that answers (only a closed port is drawn)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import json
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_main import run_main
from tests.helpers import Client, Keys
from tests.served import Served, answers_health, clean_env

KEYS = Keys(0xC11)  # the test's own key: never drawn for a ban (draws are random 32 bytes)
TABLES = ["profiles", "follows", "relay_lists", "articles", "nope", "events"]
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"),
            ipaddress.ip_network("::ffff:127.0.0.0/104"), ipaddress.ip_network("::/127")]

not_utf8 = st.binary(min_size=1, max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
surrogates = st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), min_size=1, max_size=4)
numbers = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([0, -1, 2**63 - 1, 2**63, 65535, 65536])).map(str)
text = st.one_of(st.text(max_size=20), not_utf8, surrogates, numbers, st.just(""), st.just("x" * 5000))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=10), st.just("\\ud800"))
json_objects = st.dictionaries(st.sampled_from(["pubkey", "name", "d", "followed", "published_at", "x", "_event_id"]),
                               scalars, max_size=4)


def _json_text(obj) -> str:
    return json.dumps(obj).replace('"\\\\ud800"', '"\\ud800"')  # the escaped lone surrogate, unescaped once


json_text = st.one_of(
    json_objects.map(_json_text),
    st.lists(json_objects, max_size=3).map(_json_text),
    st.integers(1, 5000).map(lambda n: '{"name": ' + "[" * n + "]" * n + "}"),
    st.integers(1, 3).map(lambda n: '{"name": "' + "x" * (n * 700_000) + '"}'),
    st.sampled_from(['{"pubkey": "\\ud800"}', '{"kinds": [1], "#t": ["\\udc00"]}', "{", "[]", "null", '{"limit": -1}',
                     '{"authors": ["' + "ab" * 32 + '"], "kinds": [0, 3]}', '{"since": 99999999999999999999}']),
    text,
)
hex_keys = st.binary(min_size=32, max_size=32).map(bytes.hex)


def _harmless_ip(item: str) -> bool:
    """False for an address or network that would block this test's own loopback connections."""
    try:
        network = ipaddress.ip_network(item, strict=False)
    except ValueError:
        return True
    return not any(network.version == loop.version and network.overlaps(loop) for loop in LOOPBACK)


def _options(**choices) -> st.SearchStrategy[list[str]]:
    """Any subset of the options in `choices` (name -> strategy of its value, or None for a flag), in any order."""
    def one(name, values):
        return st.just([name]) if values is None else values.map(lambda v: [name, v])
    return st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=3).flatmap(
        lambda names: st.tuples(*(one(n, choices[n]) for n in names)).map(lambda parts: sum(parts, [])))


def _mostly(usual: st.SearchStrategy, other: st.SearchStrategy) -> st.SearchStrategy:
    """`usual` 4 times in 5, else `other`: so that most draws pass the argument checks and reach the command."""
    return st.integers(0, 4).flatmap(lambda i: other if i == 0 else usual)


def _argv(tmp: Path) -> st.SearchStrategy[list[str]]:
    paths = st.one_of(st.sampled_from([str(tmp), str(tmp / "missing" / "f"), str(tmp / "events.jsonl"),
                                                       str(tmp / ("y" * 300)), str(tmp / "events.jsonl" / "f")]),
                      st.text("abc", min_size=1, max_size=4).map(lambda n: str(tmp / "out" / n)), not_utf8, text)
    tables = _mostly(st.sampled_from(TABLES), text)
    small = st.one_of(st.integers(0, 100).map(str), numbers)
    pks = _mostly(hex_keys.map(lambda h: json.dumps({"pubkey": h})), json_text)
    rows = _mostly(st.dictionaries(st.sampled_from(["name", "about", "d", "title"]), st.text(max_size=10),
                                   max_size=3).map(json.dumps), json_text)
    params = _mostly(st.one_of(hex_keys.map(lambda h: f"pubkey={h}"), st.sampled_from(["nip05=x", "published_at=5"])),
                     text)
    columns = _mostly(st.sampled_from(["pubkey", "nip05", "published_at", "followed"]), text)
    ban_items = st.one_of(hex_keys, st.sampled_from(["192.0.2.7", "198.51.100.0/24", "2001:db8::/32", "10.0.0.0/7",
                                                     "npub1nothex"]), text).filter(_harmless_ip)
    commands = [
        st.just(["status"]), st.just(["status", "--json"]), st.just(["verify"]), st.just(["bans", "--json"]),
        st.just(["projectors", "list"]),
        _options(**{"--projector": text, "--limit": small, "--json": None}).map(lambda o: ["projectors", "refusals", *o]),
        text.map(lambda t: ["projectors", "rebuild", t]).filter(lambda a: a[2] not in TABLES),  # no rebuild beside it
        _options(**{"--since": small, "--kinds": st.one_of(text, st.just("0,3")), "--table": tables}).map(
            lambda o: ["changes", *o]),
        st.tuples(tables, _options(**{"--where": st.one_of(text, st.sampled_from(["name LIKE 'a%'", "1"])),
                                      "--limit": small, "--pk": pks, "--param": params, "--order-by": columns,
                                      "--after": text,
                                      "--json": None, "--csv": None})).map(lambda t: ["query", t[0], *t[1]]),
        st.tuples(tables, pks).map(lambda t: ["record", "get", t[0], "--pk", t[1]]),
        st.tuples(tables, rows, _options(**{"--created-at": numbers, "--no-wait": None,
                                            "--key": paths})).map(lambda t: ["record", "put", t[0], "--row", t[1], *t[2]]),
        st.tuples(tables, pks, _options(**{"--reason": text, "--key": paths})).map(
            lambda t: ["record", "delete", t[0], "--pk", t[1], *t[2]]),
        st.tuples(st.sampled_from(["event", "pubkey", "ip"]), ban_items, _options(**{"--reason": text, "--purge": None}))
        .map(lambda t: ["ban", t[0], t[1], *t[2]]),
        st.tuples(st.sampled_from(["event", "pubkey", "ip"]), ban_items).map(lambda t: ["unban", *t]),
        _options(**{"--filter": json_text, "--output": paths}).map(lambda o: ["export", *o]),
        st.tuples(paths, _options(**{"--rejects": paths})).map(lambda t: ["import", t[0], *t[1]]).filter(
            lambda a: a[1] != "-"),
        paths.map(lambda p: ["backup", p]),
        paths.map(lambda p: ["key", "--file", p]),
        st.tuples(st.one_of(st.just("ws://127.0.0.1:1"), text.map(lambda t: "ws://" + t), text),
                  _options(**{"--filter": json_text, "--dir": st.sampled_from(["up", "down", "both", "x"]),
                              "--frame-size": numbers})).map(lambda t: ["sync", t[0], *t[1]]),
        st.one_of(st.sampled_from(["-1", "65536", "x", "99999999999999999999"]), not_utf8).map(
            lambda p: ["serve", "--port", p]),  # refused before it listens
    ]
    return st.one_of(commands)


async def _stores_an_event(port: int) -> bool:
    client = await Client.connect(f"ws://127.0.0.1:{port}")
    try:
        event = KEYS.sign(1, f"still storing {time.time_ns()}")
        return (await client.publish(event))[2] is True
    finally:
        await client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A relay serving tmp/relay.db in one process (its writer is the one the commands go through); its port."""
    tmp = tmp_path_factory.mktemp("cli_property")
    (tmp / "out").mkdir()
    (tmp / "events.jsonl").write_text(json.dumps(KEYS.sign(1, "imported")) + "\nnot json\n")
    with Served(tmp, "--db", tmp / "relay.db", "--port", "0", "--workers", "0", env=clean_env()) as relay:
        port = int(relay.started_url().rsplit(":", 1)[1])
        relay.wait_health(port)
        yield tmp, port, relay


def test_any_command_line_exits_cleanly_and_the_relay_keeps_serving(served):
    """For drawn argv of every subcommand: exit 0-3, no traceback; after each, /health answers and an event is
    stored over WebSocket."""
    tmp, port, relay = served
    exits: Counter[str] = Counter()  # "command code" -> examples: printed with -s, to see how far draws get

    @settings(max_examples=int(os.environ.get('CLI_PROPERTY_EXAMPLES', 150)), deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(argv=_argv(tmp))
    def check(argv):
        code, out, err = run_main([*argv, "--db", tmp / "relay.db"])
        exits[f"{argv[0]} {code}"] += 1
        assert code in (0, 1, 2, 3), (argv, code, err[-2000:])
        assert "Traceback" not in out + err, (argv, err[-4000:])
        assert relay.proc.poll() is None, relay.stderr[-4000:]
        assert answers_health(port), (argv, relay.stderr[-4000:])
        assert asyncio.run(_stores_an_event(port)), argv

    started, here = time.monotonic(), os.getcwd()
    os.chdir(tmp / "out")  # drawn relative paths (key files, backups, exports) are written there, not in the checkout
    try:
        check()
    finally:
        os.chdir(here)
    print(f"cli property: {time.monotonic() - started:.1f} s;", ", ".join(f"{k}: {n}" for k, n in sorted(exits.items())))
