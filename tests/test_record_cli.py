"""`relay record put | delete | get` as subprocesses on a real database (relay/commands/records.py)."""

from __future__ import annotations

import asyncio
import json

from relay.keys import NodeKey
from tests.served import relay_cli_async


async def _cli(db, *args) -> tuple[int, str, str]:
    return await relay_cli_async("record", *args, "--db", db)


async def test_put_get_delete_and_exit_codes(tmp_path):
    """put prints the signed event (exit 0); get prints the row; delete removes it, then get exits 3; an unknown
    table, a row outside the image and a malformed --row exit 2 naming what is wrong; verify stays clean."""
    db = tmp_path / "relay.db"
    code, out, _ = await _cli(db, "put", "profiles", "--row", '{"name": "cli"}')
    assert code == 0
    written = json.loads(out)
    assert written["accepted"] is True and written["event"]["kind"] == 0
    pk = json.dumps({"pubkey": written["event"]["pubkey"]})
    code, out, _ = await _cli(db, "get", "profiles", "--pk", pk)
    assert code == 0 and json.loads(out)["name"] == "cli"
    code, out, _ = await _cli(db, "delete", "profiles", "--pk", pk, "--reason", "done")
    assert code == 0 and json.loads(out)["event"]["content"] == "done"
    code, _, err = await _cli(db, "get", "profiles", "--pk", pk)
    assert code == 3 and "no row" in err
    code, _, err = await _cli(db, "put", "nope", "--row", "{}")
    assert code == 2 and "table: 'nope'" in err
    code, _, err = await _cli(db, "put", "follows", "--row", '[{"followed": "%s", "petname": "x"}]' % ("aa" * 32))
    assert code == 2 and "relay: NULL" in err
    code, _, err = await _cli(db, "put", "profiles", "--row", "not json")
    assert code == 2 and "expected a JSON object" in err
    code, out, _ = await relay_cli_async("verify", "--db", db)
    assert code == 0, out


async def test_a_refused_event_exits_1_with_the_ok_message(tmp_path):
    """An explicit created_at older than the stored version: the event is refused (exit 1, OK message on stderr)."""
    db = tmp_path / "relay.db"
    assert (await _cli(db, "put", "profiles", "--row", '{"name": "new"}'))[0] == 0
    code, out, err = await _cli(db, "put", "profiles", "--row", '{"name": "old"}', "--created-at", "1000")
    assert code == 1 and "duplicate: have a newer version" in err and json.loads(out)["accepted"] is False


async def test_two_processes_putting_one_coordinate_get_distinct_created_at(tmp_path):
    """Two `relay record put` at once on one database, signing with one key: the reservation row makes their
    created_at distinct, and the row is the one reserved second.  The one reserved first may reach the writer
    last: it is then refused as an older version (exit 1), as the issue's "the second reserved wins" asks."""
    db, key_file = tmp_path / "relay.db", tmp_path / "app.key"
    key_file.write_text(bytes(range(1, 33)).hex() + "\n")
    key_file.chmod(0o600)
    assert (await _cli(db, "put", "profiles", "--row", '{"name": "first"}', "--key", key_file))[0] == 0  # schema
    runs = await asyncio.gather(*(_cli(db, "put", "profiles", "--row", json.dumps({"name": name}), "--key", key_file)
                                  for name in ("a", "b")))
    answers = [json.loads(out) for _, out, _ in runs]
    events = [answer["event"] for answer in answers]
    assert events[0]["pubkey"] == events[1]["pubkey"] == NodeKey(bytes(range(1, 33))).pubkey
    assert events[0]["created_at"] != events[1]["created_at"]
    newest = max(events, key=lambda e: e["created_at"])
    for (code, _, err), answer in zip(runs, answers):
        if answer["event"] is newest:
            assert code == 0 and answer["accepted"] is True, runs
        else:
            assert code == 0 or (code == 1 and answer["message"].startswith("duplicate: have a newer")), runs
    code, out, _ = await _cli(db, "get", "profiles", "--pk", json.dumps({"pubkey": newest["pubkey"]}))
    assert code == 0 and json.loads(out)["_event_id"] == newest["id"]


async def test_a_key_file_that_does_not_exist_exits_3_and_creates_nothing(tmp_path):
    """`--key` naming no file is refused (exit 3, saying how to create one), not a new key in a new directory."""
    missing = tmp_path / "nonexistent" / "x.key"
    code, out, err = await _cli(tmp_path / "relay.db", "put", "profiles", "--row", '{"name": "k"}', "--key", missing)
    assert code == 3 and out == "" and "no such key file" in err and "relay key --file" in err
    assert not missing.parent.exists()


async def test_get_on_a_missing_database_exits_2_and_creates_none(tmp_path):
    """A read command on a database that is not there exits 2 "no database", like every reading command."""
    db = tmp_path / "missing.db"
    code, _, err = await _cli(db, "get", "profiles", "--pk", json.dumps({"pubkey": "ab" * 32}))
    assert code == 2 and "no database" in err
    assert not db.exists()


async def test_a_created_at_too_far_ahead_exits_3_and_later_puts_go_through(tmp_path):
    """`--created-at` past the future limit is refused "invalid:" before the clock moves: a later put with
    --no-wait is stored at once."""
    db = tmp_path / "relay.db"
    code, _, err = await _cli(db, "put", "profiles", "--row", '{"name": "fut"}', "--created-at", "4000000000")
    assert code == 3 and "invalid: created_at 4000000000 is too far in the future" in err
    code, out, err = await _cli(db, "put", "profiles", "--row", '{"name": "now"}', "--no-wait")
    assert code == 0 and json.loads(out)["accepted"] is True, err


async def test_a_lone_surrogate_exits_2_naming_the_field(tmp_path):
    """A row holding a lone surrogate is refused naming its column (exit 2), not a traceback."""
    code, _, err = await _cli(tmp_path / "relay.db", "put", "profiles", "--row", '{"name": "\\ud800"}')
    assert code == 2 and "argument --row: name: " in err and "Traceback" not in err


async def test_a_negative_created_at_is_named_as_created_at(tmp_path):
    """`--created-at -5` is a usage error about created_at, not about a cursor."""
    code, _, err = await _cli(tmp_path / "relay.db", "put", "profiles", "--row", "{}", "--created-at", "-5")
    assert code == 2 and "created_at (unix seconds) is a whole number" in err
