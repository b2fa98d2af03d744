"""REQ latency while a projector is built in the background (issue 19 point 4), beside the same relay idle.

    .venv/bin/python bench/background_build.py [--events 500000] [--batch 2000] [--db PATH]

The store: `--events` kind-1 notes (50 authors), written through `Store.submit` with the hooks `relay serve`
has but no projector (ids are real, signatures are not checked below ingest), into `--db` (kept and reused when
it holds that many events, else a temporary file).  Two runs of `relay serve` on copies of it, one after the
other, with one client sending sequential REQs `{"kinds": [1], "authors": [A], "limit": 20}` (a random author)
and timing each from REQ to EOSE:

    idle      no projector to build: REQs for as long as the build run lasted (at least 5 s)
    building  a new `notes` projector (one row per note) built in steps of `--batch` events while serving:
              REQs until its table answers 200 instead of 503

Results: p50/p99/max in milliseconds of each run, the REQs counted, the build's seconds; printed and written to
bench/results/background_build-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import websockets

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from common import HOST, RESULTS, Server, free_port, percentile  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.logging import configure_logging  # noqa: E402
from relay.node import open_store  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402

AUTHORS = 50
PROJECTOR = """
[[projectors]]
table = "notes"
kind = 1
primary_key = ["id"]
fields = [{name = "id", type = "TEXT", source = "id"}, {name = "body", type = "TEXT", source = "content"}]
"""


def author(n: int) -> str:
    return f"{n % AUTHORS + 1:064x}"


def note(i: int) -> dict:
    """Note `i`: a real id, a signature of zeros (the store below ingest checks ids, not signatures)."""
    body = [0, author(i), 1_700_000_000 + i, 1, [], f"note {i} " + "x" * 100]
    event_id = hashlib.sha256(orjson.dumps(body)).hexdigest()
    return {"id": event_id, "pubkey": body[1], "created_at": body[2], "kind": 1, "tags": [], "content": body[5],
            "sig": "00" * 64}


async def fill(db: Path, count: int) -> None:
    config = dataclasses.replace(load_config(None, {}, {"store": {"path": str(db)}}), projectors=())
    store = await open_store(config, 1)
    limits, now = EventLimits(), time.time()
    try:
        for start in range(0, count, 5000):
            outcomes = await asyncio.gather(*(store.submit(parse_event(note(i), limits, now))
                                              for i in range(start, min(count, start + 5000))))
            assert all(ok for ok, _ in outcomes), outcomes[:3]
    finally:
        await store.close()


def _holds(db: Path, count: int) -> bool:
    if not db.exists():
        return False
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM events WHERE kind = 1").fetchone()[0] == count


def table_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/tables/notes?limit=1", timeout=5) as answer:
            return answer.status == 200
    except urllib.error.HTTPError as exc:
        if exc.code != 503:
            raise
        return False


async def reqs(port: int, until, seed: int = 4) -> list[float]:
    """Seconds from REQ to EOSE of sequential REQs until `until()` (checked every 50 REQs) is true."""
    rng = random.Random(seed)
    times: list[float] = []
    async with websockets.connect(f"ws://{HOST}:{port}", max_size=None) as ws:
        while len(times) % 50 or not await asyncio.to_thread(until):
            started = time.perf_counter()
            await ws.send(orjson.dumps(["REQ", "s", {"kinds": [1], "authors": [author(rng.randrange(AUTHORS))],
                                                      "limit": 20}]).decode())
            while orjson.loads(await ws.recv())[0] != "EOSE":
                pass
            times.append(time.perf_counter() - started)
            await ws.send(orjson.dumps(["CLOSE", "s"]).decode())
    return times


def run(db: Path, tmp: Path, name: str, extra: str, batch: int, until) -> list[float]:
    copy = tmp / f"{name}.db"
    shutil.copy(db, copy)
    port = free_port()
    config = tmp / f"{name}.toml"
    config.write_text(f'[server]\nhost = "{HOST}"\nport = {port}\n[store]\npath = "{copy}"\n'
                      f"projector_build_batch = {batch}\n[http]\ntables = true\n[rate_limits]\nenabled = false\n"
                      + extra)
    server = Server(name, [sys.executable, "-m", "relay", "serve", "--config", str(config)], port, tmp,
                    cleanup=False)
    with server.start(ready_timeout=600):
        return asyncio.run(reqs(port, lambda: until(port)))


def summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"reqs": len(times), "p50_ms": percentile(ordered, 0.5) * 1000,
            "p99_ms": percentile(ordered, 0.99) * 1000, "max_ms": ordered[-1] * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=500_000, help="kind-1 events to build the projector from")
    parser.add_argument("--batch", type=int, default=2000, help="[store] projector_build_batch")
    parser.add_argument("--db", type=Path, help="database to fill or reuse (default: a temporary one)")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db = args.db or tmp / "notes.db"
        if not _holds(db, args.events):
            db.unlink(missing_ok=True)
            asyncio.run(fill(db, args.events))
        started = time.perf_counter()
        building = run(db, tmp, "building", PROJECTOR, args.batch, table_ready)
        build_seconds = time.perf_counter() - started
        idle_until = time.perf_counter() + max(5.0, build_seconds)
        idle = run(db, tmp, "idle", "", args.batch,
                   lambda port: time.perf_counter() >= idle_until)
    report = {"events": args.events, "batch": args.batch, "build_seconds_about": round(build_seconds, 2),
              "idle": summary(idle), "building": summary(building)}
    for name in ("idle", "building"):
        r = report[name]
        print(f"{name:9} {r['reqs']:6} REQs  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
              f"max {r['max_ms']:7.2f} ms")
    print(f"build: about {build_seconds:.1f} s (serve start to the table answering 200)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"background_build-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
