"""`relay serve --workers 2`: one writer process and two worker processes on one port (issue 16).

Real subprocesses (tests/served.py), real WebSocket clients; a connection's worker is named in its
handshake's Server header, /health's JSON names the worker that answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import urllib.error
from pathlib import Path

import pytest

from tests.helpers import Client, Keys, eventually
from tests.served import Served, clean_env, http_get

WORKERS = 2


def _serve(tmp_path: Path, *args, new_session: bool = False, **env) -> Served:
    return Served(tmp_path, "--db", tmp_path / "relay.db", "--port", "0", "--workers", str(WORKERS), *args,
                  env=clean_env(**env), new_session=new_session)


def _start(served: Served) -> int:
    """Wait for the relay; its port."""
    port = int(served.started_url().rsplit(":", 1)[1])
    served.wait_health(port)
    return port


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _health(port: int) -> tuple[int, dict]:
    try:
        status, _, body = http_get(port, "/health")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, json.loads(body)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


async def _one_per_worker(port: int) -> dict[int, Client]:
    """Connect until one connection is held on each worker (the kernel spreads them); the others are closed."""
    held: dict[int, Client] = {}
    for _ in range(200):
        client = await Client.connect(f"ws://127.0.0.1:{port}")
        worker = int(client.ws.response.headers["Server"].rsplit(" ", 1)[1])
        if worker in held:
            await client.close()
        else:
            held[worker] = client
        if len(held) == WORKERS:
            return held
    raise AssertionError(f"connections reached only workers {sorted(held)}")


async def _subscribed_on_every_worker(port: int, keys: Keys) -> dict[int, Client]:
    """One connection per worker, each with subscription "live" to `keys`' events (none stored yet)."""
    clients = await _one_per_worker(port)
    for client in clients.values():
        assert await client.req("live", {"authors": [keys.pubkey]}) == []
    return clients


async def _until(client: Client, sub_id: str, marker_id: str) -> list[str]:
    """The ids of the events `client` gets on `sub_id` up to and including `marker_id`."""
    ids = []
    while True:
        message = await client.recv(10.0)
        if message[0] == "EVENT" and message[1] == sub_id:
            ids.append(message[2]["id"])
            if message[2]["id"] == marker_id:
                return ids


async def _refused_by_every_worker(port: int, banned: Keys) -> None:
    """Every worker soon refuses `banned`'s events with "blocked:" (within 5 s)."""
    clients = await _one_per_worker(port)
    try:
        for client in clients.values():
            async def refused() -> bool:
                reply = await client.publish(banned.sign(1, "after the ban"))
                return reply[2] is False and reply[3].startswith("blocked:")
            assert await eventually(refused, timeout=5.0)
    finally:
        await _close_all(clients.values())


async def _close_all(clients) -> None:
    for client in clients:
        await client.close()


def test_health_names_the_answering_worker(tmp_path):
    """GET /health answers 200 {"writer": "ok", "workers": 2, "worker": i}, and each worker answers some."""
    with _serve(tmp_path) as served:
        port = _start(served)
        seen = set()
        for _ in range(200):
            status, body = _health(port)
            assert status == 200 and body["writer"] == "ok" and body["workers"] == WORKERS
            seen.add(body["worker"])
            if len(seen) == WORKERS:
                break
        assert seen == set(range(WORKERS))


@pytest.mark.parametrize("nice", [None, 0, 12])
def test_workers_run_below_the_writer_by_server_worker_nice(tmp_path, nice):
    """Each worker's nice value is the writer's plus `server.worker_nice` (default 10): the writer runs first on
    a busy machine."""
    env = {} if nice is None else {"RELAY_SERVER__WORKER_NICE": str(nice)}
    with _serve(tmp_path, **env) as served:
        _start(served)
        writer = os.getpriority(os.PRIO_PROCESS, served.proc.pid)
        workers = [os.getpriority(os.PRIO_PROCESS, pid) for pid in _children(served.proc.pid)]
        assert workers == [min(writer + (10 if nice is None else nice), 19)] * WORKERS


async def test_live_events_reach_every_worker_exactly_once(tmp_path):
    """An event published on one worker, and an ephemeral one, reach a subscriber on every worker once."""
    keys = Keys(71)
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _subscribed_on_every_worker(port, keys)
        try:
            stored, ephemeral, marker = (keys.sign(1, "stored"), keys.sign(20001, "ephemeral"),
                                         keys.sign(1, "marker"))
            publisher = await Client.connect(f"ws://127.0.0.1:{port}")  # (publish reads up to its OK)
            for event in (stored, ephemeral, marker):
                assert (await publisher.publish(event))[2] is True
            await publisher.close()
            for client in clients.values():
                got = await _until(client, "live", marker["id"])  # committed ones come in commit order
                if ephemeral["id"] not in got:  # (it may come before or after them)
                    got += await _until(client, "live", ephemeral["id"])
                assert sorted(got) == sorted([stored["id"], ephemeral["id"], marker["id"]])
                assert got.index(stored["id"]) < got.index(marker["id"])
        finally:
            await _close_all(clients.values())


async def test_req_racing_a_publish_on_another_worker_gets_it_once(tmp_path):
    """A REQ sent on one worker while the event is published on the other gets it once: stored or live."""
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _one_per_worker(port)
        publisher, reader = clients[0], clients[1]
        try:
            for round_ in range(20):
                keys = Keys(1000 + round_)
                event, marker = keys.sign(1, "raced"), keys.sign(1, "marker", created_at=int(time.time()) + 1)
                await publisher.send(["EVENT", event])
                await reader.send(["REQ", f"r{round_}", {"authors": [keys.pubkey]}])
                assert (await publisher.recv())[:3] == ["OK", event["id"], True]
                assert (await publisher.publish(marker))[2] is True
                ids, eose = [], False  # stored ones come newest first: the marker may precede the event there
                while marker["id"] not in ids or not eose:
                    message = await reader.recv(10.0)
                    if message[0] == "EVENT" and message[1] == f"r{round_}":
                        ids.append(message[2]["id"])
                    eose = eose or message == ["EOSE", f"r{round_}"]
                assert ids.count(event["id"]) == 1, ids
                await reader.send(["CLOSE", f"r{round_}"])
        finally:
            await _close_all(clients.values())


async def test_a_killed_worker_is_restarted_and_nothing_acknowledged_is_lost(tmp_path):
    """SIGKILL of a worker: the writer starts another (logged, counted); acknowledged events are all served."""
    keys = Keys(72)
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _one_per_worker(port)
        published = [keys.sign(1, f"n{i}") for i in range(20)]
        for event in published:
            assert (await clients[1].publish(event))[2] is True
        await _close_all(clients.values())
        victim = _children(served.proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        restarted = await eventually(lambda: [e for e in served.log_events() if e.get("event") == "worker_restarted"])
        assert restarted and restarted[0]["exit_code"] == -signal.SIGKILL
        assert await eventually(lambda: sum(e.get("event") == "worker_started" for e in served.log_events())
                                == WORKERS + 1)  # the new one listens
        assert victim not in _children(served.proc.pid)
        clients = await _one_per_worker(port)
        try:
            for client in clients.values():
                got = await client.req("after", {"authors": [keys.pubkey]})
                assert sorted(e["id"] for e in got) == sorted(e["id"] for e in published)
        finally:
            await _close_all(clients.values())


@pytest.mark.parametrize("to_group", [False, True], ids=["parent", "process-group"])
def test_sigterm_stops_every_process_with_exit_0(tmp_path, to_group):
    """SIGTERM to the writer, or to the whole process group: exit 0, and no worker is left."""
    with _serve(tmp_path, new_session=to_group) as served:
        _start(served)
        workers = _children(served.proc.pid)
        assert len(workers) == WORKERS
        if to_group:
            os.killpg(served.proc.pid, signal.SIGTERM)
            code = served.proc.wait(timeout=30)
        else:
            code = served.stop()
        assert code == 0, served.stderr
        assert not any(_alive(pid) for pid in workers)
        stopped = [e for e in served.log_events() if e.get("event") == "worker_stopped"]
        assert sorted(e["worker"] for e in stopped) == list(range(WORKERS))
        assert all(e["exit_code"] == 0 for e in stopped)


def test_workers_exit_when_the_writer_is_killed(tmp_path):
    """SIGKILL of the writer: every worker logs writer_lost and exits, so nothing listens on the port."""
    with _serve(tmp_path) as served:
        port = _start(served)
        workers = _children(served.proc.pid)
        served.kill()
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
        assert sum(e.get("event") == "writer_lost" for e in served.log_events()) == WORKERS


async def test_a_full_writer_queue_holds_publishers_back_and_every_event_gets_its_ok(tmp_path):
    """With a writer queue of 2 events, 20 connections publishing 25 events each all get OK true."""
    with _serve(tmp_path, RELAY_STORE__WRITER_QUEUE_SIZE="2", RELAY_STORE__MAX_BATCH="2") as served:
        port = await asyncio.to_thread(_start, served)

        async def publish_many(n: int) -> list:
            keys = Keys(500 + n)
            client = await Client.connect(f"ws://127.0.0.1:{port}")
            try:
                events = [keys.sign(1, f"{n}-{i}") for i in range(25)]
                for event in events:
                    await client.send(["EVENT", event])
                return [await client.recv(30.0) for _ in events]
            finally:
                await client.close()

        replies = [r for rs in await asyncio.gather(*(publish_many(n) for n in range(20))) for r in rs]
        assert len(replies) == 500 and all(r[0] == "OK" and r[2] is True for r in replies)


async def test_a_nip86_ban_through_one_worker_applies_in_every_worker(tmp_path):
    """NIP-86 banpubkey answered by a worker runs on the writer; every worker then refuses the pubkey (the
    lists' periodic refresh is an hour away: the writer's `moderation` frame did it)."""
    from tests.server.nip86 import PUBLIC_URL, admin_keys, call

    config = tmp_path / "relay.toml"
    config.write_text(f'[server]\npublic_url = "{PUBLIC_URL}"\n[admin]\npubkeys = ["{admin_keys().public_key().to_hex()}"]\n'
                      "refresh_seconds = 3600.0\n")
    banned = Keys(73)
    with _serve(tmp_path, "--config", config) as served:
        port = await asyncio.to_thread(_start, served)
        status, answer = await call(port, "banpubkey", banned.pubkey, "spam")
        assert status == 200 and answer.get("result") is True, answer
        await _refused_by_every_worker(port, banned)


async def test_relay_import_goes_through_the_running_writer_to_every_worker(tmp_path):
    """`relay import` on the database `relay serve --workers 2` serves: its events reach a subscriber on
    each worker, once."""
    from tests.served import relay_cli_async

    keys = Keys(74)
    imported = [keys.sign(1, f"imported {i}") for i in range(5)]
    lines = tmp_path / "events.jsonl"
    lines.write_text("".join(json.dumps(e) + "\n" for e in imported))
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _subscribed_on_every_worker(port, keys)
        try:
            code, out, err = await relay_cli_async("import", "--create", lines, "--db", tmp_path / "relay.db")
            assert code == 0, err
            for client in clients.values():
                got = await _until(client, "live", imported[-1]["id"])
                assert sorted(got) == sorted(e["id"] for e in imported)
        finally:
            await _close_all(clients.values())


def test_health_is_503_while_the_writer_does_not_answer(tmp_path):
    """A stopped writer (SIGSTOP) sends no heartbeat: a worker's /health answers 503 "unreachable" within
    about a second, and 200 again once the writer goes on (SIGCONT)."""
    with _serve(tmp_path) as served:
        port = _start(served)
        os.kill(served.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while (answer := _health(port))[0] == 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert answer[0] == 503 and answer[1]["writer"] == "unreachable" and answer[1]["workers"] == WORKERS
        finally:
            os.kill(served.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while _health(port)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        status, body = _health(port)
        assert status == 200 and body["writer"] == "ok"


async def test_relay_ban_goes_through_the_running_writer_to_every_worker(tmp_path):
    """`relay ban pubkey` beside `relay serve --workers 2`: every worker refuses the pubkey (the lists'
    periodic refresh is an hour away)."""
    from tests.served import relay_cli_async

    config = tmp_path / "relay.toml"
    config.write_text("[admin]\nrefresh_seconds = 3600.0\n")
    banned = Keys(75)
    with _serve(tmp_path, "--config", config) as served:
        port = await asyncio.to_thread(_start, served)
        code, out, err = await relay_cli_async("ban", "pubkey", banned.pubkey, "--db", tmp_path / "relay.db",
                                               "--config", config)
        assert code == 0, err
        await _refused_by_every_worker(port, banned)


async def test_a_nip98_auth_event_authorizes_one_call_whichever_worker_answers(tmp_path):
    """The same NIP-86 Authorization sent 8 times (over new connections, so to both workers): one 200, then
    401 "used already" (the claim is the writer's)."""
    from tests.server.nip86 import CONTENT_TYPE, PUBLIC_URL, admin_keys, authorization, post

    config = tmp_path / "relay.toml"
    config.write_text(f'[server]\npublic_url = "{PUBLIC_URL}"\n[admin]\npubkeys = ["{admin_keys().public_key().to_hex()}"]\n')
    body = json.dumps({"method": "supportedmethods", "params": []}).encode()
    headers = {"Content-Type": CONTENT_TYPE, "Authorization": authorization(body)}
    with _serve(tmp_path, "--config", config) as served:
        port = await asyncio.to_thread(_start, served)
        statuses = [(await asyncio.to_thread(post, port, body, headers))[0] for _ in range(8)]
        assert statuses == [200] + [401] * 7


async def test_relay_sync_goes_through_the_running_writer_to_every_worker(tmp_path, start):
    """`relay sync PEER` on the database `relay serve --workers 2` serves: the events fetched reach a subscriber
    on each worker."""
    from tests.helpers import store_events
    from tests.served import relay_cli_async

    keys = Keys(76)
    fetched = [keys.sign(1, f"from the peer {i}") for i in range(5)]
    peer = await start("peer")
    await store_events(peer.store, fetched)
    served_dir = tmp_path / "served"
    served_dir.mkdir()
    with _serve(served_dir) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _subscribed_on_every_worker(port, keys)
        try:
            code, out, err = await relay_cli_async("sync", peer.url, "--db", served_dir / "relay.db")
            assert code == 0, err
            for client in clients.values():  # (in the order sync fetched them)
                got: list[str] = []
                while not {e["id"] for e in fetched} <= set(got):
                    message = await client.recv(10.0)
                    if message[0] == "EVENT" and message[1] == "live":
                        got.append(message[2]["id"])
                assert sorted(got) == sorted(e["id"] for e in fetched)
        finally:
            await _close_all(clients.values())


async def test_a_nip86_change_is_in_force_in_every_worker_once_answered(tmp_path):
    """[auth] write = listed: once `allowpubkey` (then `banpubkey`) is answered, whichever worker answered it,
    the very next EVENT of that pubkey on every worker is accepted (then refused): the writer answers a NIP-86
    change only after each worker has read the lists again (the periodic refresh is an hour away)."""
    from tests.server.nip86 import PUBLIC_URL, admin_keys, result

    config = tmp_path / "relay.toml"
    config.write_text(f'[server]\npublic_url = "{PUBLIC_URL}"\n'
                      f'[admin]\npubkeys = ["{admin_keys().public_key().to_hex()}"]\nrefresh_seconds = 3600.0\n'
                      f'[auth]\nwrite = "listed"\nwrite_pubkeys = ["{Keys(1).pubkey}"]\n')
    with _serve(tmp_path, "--config", config) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _one_per_worker(port)
        try:
            for round_ in range(5):  # one worker answers each call: the other is the one that was late
                author = Keys(100 + round_)
                await result(port, "allowpubkey", author.pubkey, "listed now")
                for worker, client in clients.items():
                    reply = await client.publish(author.sign(1, f"allowed {worker}"))
                    assert reply[2] is True, (worker, reply)
                await result(port, "banpubkey", author.pubkey)
                for worker, client in clients.items():
                    reply = await client.publish(author.sign(1, f"banned {worker}"))
                    assert reply[2] is False and reply[3].startswith("blocked:"), (worker, reply)
        finally:
            await _close_all(clients.values())
