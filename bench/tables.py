"""Records over HTTP (`GET /tables/NAME`, issue 19): p50/p99 of a key lookup and of a 100-row page on a large
`follows` table, run on demand.

    .venv/bin/python bench/tables.py [--authors 1000] [--follows 1000] [--requests 2000] [--db PATH]

The table: `--authors` kind-3 follow lists of `--follows` `p` tags each (authors x follows rows; the
defaults make 1,000,000), signed once with fixed keys and written through `Store.submit` with the hooks
`relay serve` has (so the `follows` projector fills the table), into `--db` (kept and reused when it holds
the same count, else a fresh temporary file).  Then `relay serve` runs on it with `[http] tables = true`
(rate limits off: one client IP) and one client sends `--requests` sequential GETs of each shape, one TCP
connection each (as a browser's fetch without keep-alive):

    lookup   /tables/follows?pubkey=A&followed=B      a random existing row by its whole key
    page     /tables/follows?pubkey=A&limit=100       the first page of a random author's follows
    next     /tables/follows?pubkey=A&limit=100&after=CURSOR   the page after a random row of that author

Latency is from connect to the last byte of the answer; every answer is parsed and checked (status 200, the
row asked for, 100 rows).  Results: p50/p99 in milliseconds, printed and written to
bench/results/tables-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from coincurve import PrivateKey

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from common import HOST, RESULTS, Server, free_port, percentile  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.hooks import hooks  # noqa: E402
from relay.logging import configure_logging  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.store.records import encode_cursor  # noqa: E402
from relay.store.store import Store  # noqa: E402

CREATED_AT = 1_790_000_000


def pubkey(n: int) -> str:
    """A deterministic 64-hex pubkey for followed account `n` (never signs: only named in `p` tags)."""
    return n.to_bytes(32, "big").hex()


def follow_list(author: int, follows: int) -> dict:
    """Author `author`'s kind-3 event following `follows` accounts (a window of the id space, per author)."""
    key = PrivateKey((author + 1).to_bytes(32, "big"))
    tags = [["p", pubkey(author * 7 + i)] for i in range(follows)]
    body = [0, key.public_key_xonly.format().hex(), CREATED_AT, 3, tags, ""]
    event_id = hashlib.sha256(orjson.dumps(body)).hexdigest()
    return {"id": event_id, "pubkey": body[1], "created_at": CREATED_AT, "kind": 3, "tags": tags, "content": "",
            "sig": key.sign_schnorr(bytes.fromhex(event_id)).hex()}


async def fill(db: Path, authors: int, follows: int) -> list[dict]:
    """Write the follow lists into `db` with `relay serve`'s hooks; returns them."""
    config = load_config(None, {}, {"store": {"path": str(db)}})
    events = [follow_list(a, follows) for a in range(authors)]
    limits = EventLimits(max_tags=max(follows, 10_000), max_content_bytes=2**30, max_created_at_future_seconds=10**10)
    store = await Store.open(db, config.store.options(1), hooks(config))
    try:
        for start in range(0, len(events), 64):
            chunk = [parse_event(e, limits, time.time()) for e in events[start:start + 64]]
            outcomes = await asyncio.gather(*(store.submit(e) for e in chunk))
            assert all(ok for ok, _ in outcomes), outcomes[:3]
    finally:
        await store.close()
    return events


async def get(port: int, target: str) -> tuple[float, int, dict]:
    """(seconds, status, JSON body) of one GET on its own connection."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    elapsed = time.perf_counter() - started
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return elapsed, int(head.split(b" ", 2)[1]), orjson.loads(body)


async def measure(port: int, events: list[dict], requests: int, seed: int = 19) -> dict[str, list[float]]:
    """Latencies (seconds) of each request shape, checked."""
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"lookup": [], "page": [], "next": []}
    for _ in range(requests):
        event = rng.choice(events)
        followed = sorted(t[1] for t in event["tags"])
        author = event["pubkey"]
        wanted = rng.choice(followed)
        elapsed, status, body = await get(port, f"/tables/follows?pubkey={author}&followed={wanted}")
        assert status == 200 and [r["followed"] for r in body["rows"]] == [wanted], body
        times["lookup"].append(elapsed)
        elapsed, status, body = await get(port, f"/tables/follows?pubkey={author}&limit=100")
        assert status == 200 and len(body["rows"]) == min(100, len(followed)), body
        times["page"].append(elapsed)
        start = rng.randrange(max(1, len(followed) - 100))
        cursor = encode_cursor([author, followed[start]])  # (the order of a key walk: pubkey, followed)
        elapsed, status, body = await get(port, f"/tables/follows?pubkey={author}&limit=100&after={cursor}")
        assert status == 200 and [r["followed"] for r in body["rows"]] == followed[start + 1:start + 101], body
        times["next"].append(elapsed)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=int, default=1000)
    parser.add_argument("--follows", type=int, default=1000, help="p tags (rows) per author")
    parser.add_argument("--requests", type=int, default=2000, help="requests of each shape")
    parser.add_argument("--db", type=Path, help="database to fill or reuse (default: a temporary one)")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "tables.db"
        rows = args.authors * args.follows
        started = time.perf_counter()
        events = asyncio.run(fill(db, args.authors, args.follows)) if not _holds(db, rows) else \
            [follow_list(a, args.follows) for a in range(args.authors)]
        print(f"follows: {rows:,} rows ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        port = free_port()
        server = Server("tables", [sys.executable, "-m", "relay", "serve", "--host", HOST, "--port", str(port),
                                   "--db", str(db)], port, Path(tmp),
                        env={"RELAY_RATE_LIMITS__ENABLED": "false", "RELAY_HTTP__TABLES": "true"}, cleanup=False)
        with server.start(ready_timeout=600):
            times = asyncio.run(measure(port, events, args.requests))
    report = {"rows": rows, "requests": args.requests, **{
        shape: {"p50_ms": percentile(sorted(v), 0.5) * 1000, "p99_ms": percentile(sorted(v), 0.99) * 1000,
                "mean_ms": statistics.fmean(v) * 1000} for shape, v in times.items()}}
    for shape in times:
        print(f"{shape:7} p50 {report[shape]['p50_ms']:7.2f} ms  p99 {report[shape]['p99_ms']:7.2f} ms")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"tables-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _holds(db: Path, rows: int) -> bool:
    """Whether `db` already holds a follows table of `rows` rows (a rerun reuses it)."""
    if not db.exists():
        return False
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM follows").fetchone()[0] == rows
    except sqlite3.Error:
        return False
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
