"""The read-only HTTP API of records (`[http] tables`, relay/server/tables.py) and its Python API
(`Node.records`, relay/store/records.py), on a real relay with a real SQLite file."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import urllib.error
import urllib.parse

from relay.store.projectors import ProjectorSpec
from relay.store.records import RecordQueryError
from tests.conftest import make_config
from tests.helpers import Keys, store_events
from tests.inprocess import running
from tests.served import http_get

DMS = ProjectorSpec(table="dms", kind=4, primary_key=("id",), indexes=(("recipient",),),
                    fields=({"name": "id", "type": "TEXT", "source": "id"},
                            {"name": "recipient", "type": "TEXT", "source": "tag:p"},
                            {"name": "body", "type": "TEXT", "source": "content"}))


def _config(tmp_path, **sections):
    config = make_config(tmp_path, http={"tables": True, "tables_max_limit": 50, **sections.pop("http", {})},
                         **sections)
    return dataclasses.replace(config, projectors=(*config.projectors, DMS))


async def _get(relay, path: str) -> tuple[int, dict]:
    """(status, JSON body) of GET `path`, off the event loop."""
    try:
        status, _, body = await asyncio.to_thread(http_get, relay.port, path, None, 5.0)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, json.loads(body)


def _profile(keys: Keys, nip05: str, created_at: int) -> dict:
    return keys.sign(0, json.dumps({"name": "n", "nip05": nip05}), created_at=created_at)


async def test_tables_lists_columns_key_and_indexes_without_private_kinds(tmp_path):
    """GET /tables names each projected table with its columns, key and indexes; a private kind's table is absent."""
    async with running(_config(tmp_path)) as relay:
        status, headers, raw = await asyncio.to_thread(http_get, relay.port, "/tables", {"Origin": "https://app"}, 5.0)
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"  # CORS as NIP-11's
        assert headers["Content-Type"] == "application/json"
        tables = {t["name"]: t for t in json.loads(raw)["tables"]}
        assert set(tables) == {"profiles", "follows", "relay_lists", "articles"}  # not dms (kind 4 is private)
        assert tables["follows"]["key"] == ["pubkey", "followed"]
        assert tables["profiles"]["indexes"] == [["nip05"]]
        assert {"name": "nip05", "type": "TEXT"} in tables["profiles"]["columns"]
        await store_events(relay.store, [Keys(5).sign(4, "secret", [["p", Keys(6).pubkey]])])
        assert await _get(relay, "/tables/dms") == (404, {"error": "not found: no table 'dms' is served here",
                                                          "parameter": "table"})
        # (the Python API of the application itself reads it)
        assert (await relay.node.records.query_records("profiles")).rows == []


async def test_cors_preflight_for_a_table_names_get(tmp_path):
    """A browser's preflight (OPTIONS with Access-Control-Request-Method) for /tables/NAME is answered 204, GET."""
    async with running(_config(tmp_path)) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"OPTIONS /tables/profiles?pubkey=x HTTP/1.1\r\nHost: h\r\nOrigin: https://app\r\n"
                     b"Access-Control-Request-Method: GET\r\n\r\n")
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        writer.close()
        assert head.startswith("http/1.1 204") and "access-control-allow-methods: get\r\n" in head


async def test_tables_are_off_by_default(tmp_path):
    """Without `[http] tables = true`, /tables is no route (404 off the relay's endpoint)."""
    async with running(make_config(tmp_path)) as relay:
        with_error = await asyncio.to_thread(_status_of, relay.port, "/tables")
        assert with_error == 404


def _status_of(port: int, path: str) -> int:
    try:
        return http_get(port, path)[0]
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_bad_parameters_are_refused_naming_the_parameter(tmp_path):
    """Unknown or unindexed columns, an unindexed order, a bad limit or cursor: 400 with the parameter named."""
    async with running(_config(tmp_path)) as relay:
        for query, parameter in (("name=n", "name"), ("nope=1", "nope"), ("order_by=about", "order_by"),
                                 ("order_by=nope", "order_by"), ("limit=0", "limit"), ("limit=x", "limit"),
                                 ("after=%21%21", "after"), ("after=WzFd", "after"), ("pubkey=a&pubkey=b", "pubkey"),
                                 ("=x", "")):  # an empty name is named too, as ""
            status, body = await _get(relay, "/tables/profiles?" + query)
            assert (status, body["parameter"]) == (400, parameter), (query, body)
            assert body["error"].startswith("invalid: ")
        for path, parameter in (("articles?published_at=soon", "published_at"),
                                ("follows?followed=" + "a" * 64, "followed"),  # no index starts with it
                                ("follows?order_by=followed", "order_by"),  # would sort the whole table
                                # past SQLite's 64-bit integers: an OverflowError (500) before
                                (f"articles?published_at={2**63}", "published_at"),
                                (f"articles?published_at={-2**63 - 1}", "published_at")):
            status, body = await _get(relay, "/tables/" + path)
            assert (status, body["parameter"]) == (400, parameter), body


async def test_key_lookup_and_clamped_limit(tmp_path):
    """A key lookup answers that row; a limit past tables_max_limit is clamped to it; Python's get_record agrees."""
    async with running(_config(tmp_path)) as relay:
        author = Keys(7)
        follows = [Keys(100 + i).pubkey for i in range(60)]
        await store_events(relay.store, [author.sign(3, "", [["p", p] for p in follows])])
        status, body = await _get(relay, f"/tables/follows?pubkey={author.pubkey}&followed={follows[3]}")
        assert status == 200 and [r["followed"] for r in body["rows"]] == [follows[3]] and body["next"] is None
        status, body = await _get(relay, f"/tables/follows?pubkey={author.pubkey}&limit=1000")
        assert len(body["rows"]) == 50 and body["next"] is not None  # [http] tables_max_limit = 50
        row = await relay.node.records.get_record("follows", {"pubkey": author.pubkey, "followed": follows[3]})
        assert row == body["rows"][[r["followed"] for r in body["rows"]].index(follows[3])]
        assert await relay.node.records.get_record("follows", {"pubkey": author.pubkey, "followed": "0" * 64}) is None
        try:
            await relay.node.records.get_record("follows", {"pubkey": author.pubkey})
            raise AssertionError("a partial key was accepted")
        except RecordQueryError as exc:
            assert exc.parameter == "followed"


async def test_pages_joined_hold_every_unchanged_row_once_in_order_while_rows_are_written(tmp_path):
    """Walking /tables/profiles by nip05 while profiles are added and changed: every row unchanged during the
    walk comes exactly once, the pages are in (nip05, pubkey) order, a changed row at most once per version."""
    async with running(_config(tmp_path)) as relay:
        rng = random.Random(19)
        authors = [Keys(1000 + i) for i in range(300)]
        start = 1_700_000_000
        await store_events(relay.store, [_profile(k, f"u{rng.randrange(40)}@x", start) for k in authors])
        changed: set[str] = set()
        walked = asyncio.Event()

        async def write() -> None:
            n = 0
            while not walked.is_set():
                n += 1
                k = rng.choice(authors)
                changed.add(k.pubkey)
                await store_events(relay.store, [_profile(k, f"u{rng.randrange(40)}@x", start + n),
                                                 _profile(Keys(5000 + n), f"u{rng.randrange(40)}@x", start)])
                await asyncio.sleep(0)

        writer = asyncio.create_task(write())
        rows, after = [], None
        while True:
            query = {"order_by": "nip05", "limit": "7", **({"after": after} if after else {})}
            status, body = await _get(relay, "/tables/profiles?" + urllib.parse.urlencode(query))
            assert status == 200, body
            rows += body["rows"]
            after = body["next"]
            if after is None:
                break
        walked.set()
        await writer
        order = [(r["nip05"], r["pubkey"]) for r in rows]
        assert order == sorted(order) and len(set(order)) == len(order)
        assert len({r["_event_id"] for r in rows}) == len(rows)
        seen = [r["pubkey"] for r in rows]
        unchanged = {k.pubkey for k in authors} - changed
        assert changed and unchanged
        assert all(seen.count(p) == 1 for p in unchanged)


async def test_table_reads_are_rate_limited_like_req(tmp_path):
    """A client IP past its REQ bucket gets 429 with a `rate-limited:` error."""
    async with running(_config(tmp_path, rate_limits={"exempt": [], "exempt_loopback": False, "ip_reqs_per_second": 0.01,
                                                 "ip_reqs_burst": 3})) as relay:
        statuses = [(await _get(relay, "/tables/profiles"))[0] for _ in range(3)]
        status, body = await _get(relay, "/tables")
        assert statuses == [200, 200, 200] and status == 429 and body["error"].startswith("rate-limited:")
        assert "parameter" not in body  # no parameter is at fault
