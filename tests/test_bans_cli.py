"""`relay ban`, `relay unban`, `relay bans` as subprocesses on a real database, and on one a relay serves."""

from __future__ import annotations

import asyncio
import json

from websockets.exceptions import ConnectionClosed

from relay.ingest.moderation import Moderation
from relay.node import open_store
from tests.conftest import make_config
from tests.helpers import Client, eventually
from tests.inprocess import Relay
from tests.served import Served, relay_cli_async
from tests.server.test_workers import _start
from tests.store.test_bans import _event


async def _cli(db, *args) -> tuple[int, str, str]:
    return await relay_cli_async(*args, "--db", db)


async def _verify(db) -> None:
    code, out, _ = await _cli(db, "verify")
    assert code == 0, out


async def test_ban_unban_and_bans_keep_verify_clean(tmp_path, alice, bob):
    """ban event (removed), ban pubkey --purge (its events removed, in batches), bans --json lists both,
    unban lifts them (exit 1 for something not banned, 2 for a malformed id); relay verify clean after each."""
    config = make_config(tmp_path, admin={"purge_batch_size": 2})
    db = config.store.path
    store = await open_store(config)
    spam = bob.sign(content="spam", tags=[["t", "x"]])
    for e in [alice.sign(kind=0, content='{"name":"a"}')] + [alice.sign(content=str(i)) for i in range(4)] + [spam]:
        assert (await store.submit(_event(config, e)))[0]
    await store.close()

    code, out, _ = await _cli(db, "ban", "event", spam["id"], "--reason", "spam")
    assert code == 0 and "removed" in out
    await _verify(db)
    code, out, _ = await _cli(db, "ban", "pubkey", alice.pubkey, "--purge")
    assert code == 0 and "5 stored events removed" in out
    await _verify(db)
    code, out, _ = await _cli(db, "bans", "--json")
    assert json.loads(out) == {
        "pubkeys": [{"pubkey": alice.pubkey, "reason": "", "at": json.loads(out)["pubkeys"][0]["at"],
                     "purging": False}],
        "events": [{"id": spam["id"], "reason": "spam", "at": json.loads(out)["events"][0]["at"]}], "ips": [],
        "kinds": []}
    assert (await _cli(db, "unban", "pubkey", alice.pubkey))[0] == 0
    assert (await _cli(db, "unban", "event", spam["id"]))[0] == 0
    code, out, err = await _cli(db, "unban", "ip", "192.0.2.1")
    assert (code, out) == (1, "") and "192.0.2.1/32 was not banned" in err  # a failure: on stderr
    assert (await _cli(db, "unban", "event", "XYZ"))[0] == 2
    assert (await _cli(db, "ban", "pubkey", "npub1nothex"))[0] == 2
    code, out, _ = await _cli(db, "bans")
    assert (code, out) == (0, "what\titem\trule\treason\tat\tpurging\n")  # the header alone
    await _verify(db)


async def test_bans_lists_the_kind_rules_of_the_config_and_the_database(tmp_path):
    """`relay bans` shows `[auth] deny_kinds` (reason "config: ...") and NIP-86's allowkind/disallowkind rows."""
    config = make_config(tmp_path)
    moderation = await Moderation.open(await open_store(config), config)
    await moderation.set_kind(7, allow=True, reason="reactions only")
    await moderation.set_kind(4, allow=False)
    await moderation.store.close()
    toml = tmp_path / "relay.toml"
    toml.write_text("[auth]\ndeny_kinds = [1059]\n")
    code, out, _ = await _cli(config.store.path, "bans", "--json", "--config", toml)
    assert code == 0
    kinds = [{k: v for k, v in row.items() if k != "at"} for row in json.loads(out)["kinds"]]
    assert kinds == [{"kind": 1059, "rule": "deny", "reason": "config: [auth] deny_kinds"},
                     {"kind": 7, "rule": "allow", "reason": "reactions only"},
                     {"kind": 4, "rule": "deny", "reason": ""}]
    code, out, _ = await _cli(config.store.path, "bans", "--config", toml)
    assert out.splitlines()[1] == "kind\t1059\tdeny\tconfig: [auth] deny_kinds\t\t"


async def test_a_ban_from_the_command_line_reaches_a_running_relay(tmp_path, alice):
    """`relay ban pubkey` in another process while the relay serves: within refresh_seconds the author's
    next EVENT on an open connection gets "blocked:"."""
    relay = Relay(make_config(tmp_path, admin={"refresh_seconds": 0.1}))
    await relay.start()
    try:
        client = await Client.connect(relay.url)
        assert (await client.publish(alice.sign(content="before")))[2] is True
        assert (await _cli(relay.config.store.path, "ban", "pubkey", alice.pubkey))[0] == 0

        async def blocked() -> bool:
            ok = await client.publish(alice.sign(content="after"))
            return ok[2] is False and ok[3].startswith("blocked: ")

        assert await eventually(blocked)
        await client.close()
    finally:
        await relay.stop()


async def test_ban_commands_refuse_a_missing_database(tmp_path, alice):
    """A mistyped --db: ban, unban and bans exit 2 with one line naming it, and create neither file nor
    directory."""
    db = tmp_path / "typo" / "relay.db"
    for args in (("ban", "pubkey", alice.pubkey), ("unban", "pubkey", alice.pubkey), ("bans",)):
        code, out, err = await _cli(db, *args)
        assert (code, out, err.count("\n")) == (2, "", 1) and f"{db}: no such database" in err, err
    assert not (tmp_path / "typo").exists()


async def test_ban_ip_from_the_command_line_refuses_new_connections_until_unban(tmp_path, alice):
    """`relay ban ip 127.0.0.1` while the relay serves: within refresh_seconds a new connection from loopback
    is closed at once (1008 "blocked: ..."); `bans` lists it with its reason; `relay unban ip` lets it in
    again; a malformed address exits 2."""
    relay = Relay(make_config(tmp_path, admin={"refresh_seconds": 0.1}))
    await relay.start()
    db = relay.config.store.path
    try:
        assert (await _cli(db, "ban", "ip", "300.0.0.1"))[0] == 2
        code, out, _ = await _cli(db, "ban", "ip", "127.0.0.1", "--reason", "abuse")
        assert (code, out) == (0, "relay ban: ip 127.0.0.1/32 blocked\n")
        assert json.loads((await _cli(db, "bans", "--json"))[1])["ips"][0] | {"at": 0} == {
            "ip": "127.0.0.1/32", "reason": "abuse", "at": 0}

        async def refused() -> bool:
            client = await Client.connect(relay.url)
            try:
                await client.recv(timeout=1)
            except ConnectionClosed:
                return client.ws.close_code == 1008 and client.ws.close_reason.startswith("blocked: ")
            except TimeoutError:
                await client.close()
            return False

        assert await eventually(refused)
        assert (await _cli(db, "unban", "ip", "127.0.0.1"))[0] == 0

        async def admitted() -> bool:
            client = await Client.connect(relay.url)
            try:
                return (await client.publish(alice.sign(content="back")))[2] is True
            except ConnectionClosed:
                return False
            finally:
                await client.close()

        assert await eventually(admitted)
    finally:
        await relay.stop()


async def test_ban_refuses_an_admin_a_too_wide_network_and_a_long_reason(tmp_path, alice):
    """`relay ban pubkey` of an `[admin] pubkeys` pubkey, `relay ban ip` of a network wider than /8 (/32 for
    IPv6), a --reason past 1,000 characters: exit 2 with one line saying why, and nothing is banned; a /8 and
    a 1,000-character reason are taken."""
    relay = Relay(make_config(tmp_path))
    await relay.start()
    await relay.stop()
    db = relay.config.store.path
    config = tmp_path / "admin.toml"
    config.write_text(f'[admin]\npubkeys = ["{alice.pubkey}"]\n[server]\npublic_url = "wss://relay.example"\n')
    for args, why in ((("ban", "pubkey", alice.pubkey), "remove it from [admin] pubkeys"),
                      (("ban", "ip", "0.0.0.0/0"), "wider than /8"), (("ban", "ip", "2001:db8::/31"), "wider than /32"),
                      (("ban", "pubkey", "ab" * 32, "--reason", "x" * 1001), "--reason is longer than 1000")):
        code, out, err = await _cli(db, *args, "--config", config)
        assert (code, out, err.count("\n")) == (2, "", 1) and why in err, err
    assert (await _cli(db, "ban", "ip", "10.0.0.0/8", "--config", config))[0] == 0
    assert (await _cli(db, "ban", "pubkey", "ab" * 32, "--reason", "x" * 1000, "--config", config))[0] == 0
    found = json.loads((await _cli(db, "bans", "--json"))[1])
    assert ([p["pubkey"] for p in found["pubkeys"]], [i["ip"] for i in found["ips"]]) == (["ab" * 32], ["10.0.0.0/8"])


async def test_ban_of_the_serving_relays_admin_is_refused_without_config(tmp_path, alice):
    """`relay ban pubkey ADMIN` without --config, beside a `relay serve` whose [admin] pubkeys holds ADMIN: the
    serving relay's writer refuses it (exit 2, one line), nothing is banned, and the admin may still publish."""
    db = tmp_path / "relay.db"
    config = tmp_path / "admin.toml"
    config.write_text(f'[admin]\npubkeys = ["{alice.pubkey}"]\n[server]\npublic_url = "wss://relay.example"\n')
    with Served(tmp_path, "--config", config, "--db", db, "--port", "0") as served:
        port = await asyncio.to_thread(_start, served)
        code, out, err = await _cli(db, "ban", "pubkey", alice.pubkey)
        assert (code, out, err.count("\n")) == (2, "", 1) and "remove it from [admin] pubkeys" in err, err
        assert json.loads((await _cli(db, "bans", "--json"))[1])["pubkeys"] == []
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        assert (await client.publish(alice.sign(content="still here")))[2] is True
        await client.close()


async def test_ban_purge_beside_a_serving_relay_leaves_the_purge_to_it(tmp_path, alice, bob):
    """`relay ban pubkey X --purge` beside a `relay serve`: the serving relay's writer purges X's events (its
    count was 0, as the relay had removed them first); the command says the relay removes them, and they go."""
    db = tmp_path / "relay.db"
    with Served(tmp_path, "--db", db, "--port", "0") as served:
        port = await asyncio.to_thread(_start, served)
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        for i in range(3):
            assert (await client.publish(bob.sign(content=f"spam {i}")))[2] is True
        code, out, err = await _cli(db, "ban", "pubkey", bob.pubkey, "--purge")
        assert code == 0 and "the relay serving the database removes its stored events" in out, (out, err)
        assert await eventually(lambda: _none_of(client, bob.pubkey))
        await client.close()


async def _none_of(client: Client, pubkey: str) -> bool:
    return await client.req(f"q{pubkey[:4]}", {"authors": [pubkey]}) == []
