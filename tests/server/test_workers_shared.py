"""What the processes of `relay serve --workers 2` share: per-IP limits, /metrics of the whole relay, the
processes file of `relay status`, and the process tuning (relay/supervisor.py, relay/worker.py).

Real subprocesses (tests/served.py) and real WebSocket clients from this host; a connection's worker is named
in its handshake's Server header.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed

from relay.server.ratelimit import TOO_MANY_CONNECTIONS
from tests.helpers import Client, Keys, eventually
from tests.served import Served, clean_env, http_get, relay_cli_async
from tests.server.test_workers import WORKERS, _children, _close_all, _one_per_worker, _serve, _start

CAP = 4  # rate_limits.ip_connections


def _limited(tmp_path: Path) -> Path:
    """A config file: loopback clients limited to CAP connections, no other limit in the way."""
    config = tmp_path / "relay.toml"
    config.write_text(f"[rate_limits]\nexempt = []\nexempt_loopback = false\nip_connections = {CAP}\n")
    return config


def _worker(client: Client) -> int:
    return int(client.ws.response.headers["Server"].rsplit(" ", 1)[1])


async def _usable(client: Client) -> bool:
    """Whether `client` was admitted: a REQ on it gets its EOSE (a refused one is closed at once)."""
    try:
        return await client.req("probe", {"kinds": [1], "limit": 0}) == []
    except ConnectionClosed:
        return False


async def _spread(port: int, n: int) -> list[Client]:
    """`n` admitted connections from this host with some on every worker (the kernel spreads them; when it did
    not, they are closed and made again)."""
    for _ in range(20):
        clients = [await Client.connect(f"ws://127.0.0.1:{port}") for _ in range(n)]
        if all([await _usable(c) for c in clients]) and len({_worker(c) for c in clients}) == WORKERS:
            return clients
        await _close_all(clients)
        await asyncio.sleep(0.5)  # (their places are given back as each worker sees its connection end)
    raise AssertionError(f"{n} connections never reached every worker")


async def _refused(port: int) -> None:
    """One more connection is closed at once with 1008 and TOO_MANY_CONNECTIONS."""
    client = await Client.connect(f"ws://127.0.0.1:{port}")
    with pytest.raises(ConnectionClosed):
        await client.recv()
    assert (client.ws.close_code, client.ws.close_reason) == (1008, TOO_MANY_CONNECTIONS)


def _metrics(port: int) -> dict[str, float]:
    """The unlabelled samples of GET /metrics, by name."""
    text = http_get(port, "/metrics")[2].decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if not s.labels}


async def _processes(db: Path) -> dict:
    code, out, err = await relay_cli_async("status", "--db", db, "--json")
    assert code == 0, err
    return json.loads(out)["processes"]


async def test_ip_connections_hold_across_workers(tmp_path):
    """`ip_connections = 4` with connections from one IP on both workers: the fifth is refused, whichever
    worker takes it, and counted in the whole relay's relay_connections_refused_total."""
    with _serve(tmp_path, "--config", _limited(tmp_path)) as served:
        port = await asyncio.to_thread(_start, served)
        held = await _spread(port, CAP)
        try:
            for _ in range(3):
                await _refused(port)
            assert await eventually(lambda: _metrics(port).get("relay_connections_refused_total") == 3)
        finally:
            await _close_all(held)


async def test_metrics_from_a_worker_report_the_whole_relay(tmp_path):
    """GET /metrics, whichever worker answers: the events the writer stored, and the connections of both
    workers summed."""
    keys = Keys(81)
    with _serve(tmp_path) as served:
        port = await asyncio.to_thread(_start, served)
        clients = await _one_per_worker(port)
        try:
            for i in range(3):
                assert (await clients[0].publish(keys.sign(1, f"counted {i}")))[2] is True

            def whole(page: dict[str, float]) -> bool:
                return page.get("relay_events_stored_total") == 3 and page.get("relay_connections") == WORKERS

            assert await eventually(lambda: whole(_metrics(port)))
            assert all(whole(_metrics(port)) for _ in range(8))  # (the kernel spreads these over both workers)
        finally:
            await _close_all(clients.values())


async def test_a_killed_worker_frees_its_places_and_shows_in_status_and_metrics(tmp_path):
    """`relay status` lists the writer and both workers; after SIGKILL of a worker holding connections of an IP
    at its cap, the restarted worker shows 1 restart in status and relay_worker_restarts_total, and the IP
    may open as many connections as the dead worker held, not one more."""
    db = tmp_path / "relay.db"
    with _serve(tmp_path, "--config", _limited(tmp_path)) as served:
        port = await asyncio.to_thread(_start, served)
        processes = await _processes(db)
        assert processes["writer"]["pid"] == served.proc.pid
        assert sorted(w["index"] for w in processes["workers"]) == list(range(WORKERS))
        assert sorted(w["pid"] for w in processes["workers"]) == sorted(_children(served.proc.pid))
        held = await _spread(port, CAP)
        victim = _worker(held[0])
        survivors = [c for c in held if _worker(c) != victim]
        os.kill(next(w["pid"] for w in processes["workers"] if w["index"] == victim), signal.SIGKILL)
        assert await eventually(lambda: sum(e.get("event") == "worker_started" for e in served.log_events())
                                == WORKERS + 1)
        fresh = [await Client.connect(f"ws://127.0.0.1:{port}") for _ in range(CAP - len(survivors))]
        try:
            assert all([await _usable(c) for c in fresh])
            await _refused(port)
            after = {w["index"]: w for w in (await _processes(db))["workers"]}
            assert after[victim]["restarts"] == 1 and after[1 - victim]["restarts"] == 0
            assert after[victim]["pid"] in _children(served.proc.pid)
            assert _metrics(port)["relay_worker_restarts_total"] == 1
        finally:
            await _close_all(survivors + fresh)


_RECORDER = """
import atexit, gc, json, os, sys

def _record():
    with open(os.path.join({out!r}, f"{{os.getpid()}}.json"), "w") as f:
        json.dump({{"argv": sys.argv, "threshold": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                   "switch": sys.getswitchinterval()}}, f)

atexit.register(_record)
"""


def test_the_writer_and_every_worker_are_tuned(tmp_path):
    """Each worker runs with the process tuning of one process (GC frozen and its thresholds raised, the short
    switch interval); the writer, which answers no client, collects its young objects 10x less often. Each
    process writes its settings at exit (a sitecustomize)."""
    site, out = tmp_path / "site", tmp_path / "settings"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(_RECORDER.format(out=str(out)))
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    with Served(tmp_path, "--db", tmp_path / "relay.db", "--port", "0", "--workers", str(WORKERS),
                env=clean_env(PYTHONPATH=path)) as served:
        _start(served)
        assert served.stop() == 0, served.stderr
    settings = [json.loads(p.read_text()) for p in out.iterdir()]
    workers = [s for s in settings if s["argv"][0].endswith("worker.py")]
    writers = [s for s in settings if "serve" in s["argv"]]
    assert len(workers) == WORKERS and len(writers) == 1, settings
    for s in workers + writers:
        assert s["frozen"] > 0 and s["switch"] == pytest.approx(0.0005)
    assert [s["threshold"] for s in workers] == [[10_000, 10, 10]] * WORKERS
    assert writers[0]["threshold"] == [100_000, 20, 100]
