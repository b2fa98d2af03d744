"""The writer's cost of the change feed: write-transaction µs per event, before and after, and feed reads/s.

    .venv/bin/python bench/change_feed.py --n 100000 --json bench/results/change_feed-after.json
    mkdir /tmp/relay-base && git archive de32f7f relay | tar -x -C /tmp/relay-base   # before the change feed
    PYTHONPATH=/tmp/relay-base .venv/bin/python bench/change_feed.py --n 100000 --json bench/results/change_feed-before.json

(PYTHONPATH comes before the installed tree on sys.path, so the second run measures the older `relay`.)

Two workloads, each into a fresh database opened as `relay serve` opens it (`relay.node.open_store`: WAL,
the negentropy index hook), submitted in rounds of --round events at once so that the writer commits
batches as under load:
- mix: the first n bench events (bench/events.py: 7% replaceable kinds, few supersessions);
- replace: n kind-0 versions from 100 authors in created_at order: every event after an author's first
  supersedes one, so every transaction logs as many removals as it inserts (the feed's worst case).
Reported per workload: the writer's seconds inside its transactions (`open_store`'s `on_batch`) per event, the
wall time, and, where the tree has the feed, the rate at which the whole feed reads back in pages of 1,000.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson
from coincurve import PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parent))
import events  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.node import open_store  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402

AUTHORS = 100


def replace_lines(n: int) -> list[bytes]:
    """n signed kind-0 versions: author i % AUTHORS, created_at rising (each supersedes the author's previous)."""
    keys = [PrivateKey(events.author_secret(7, i)) for i in range(AUTHORS)]
    pubkeys = [k.public_key_xonly.format().hex() for k in keys]
    lines = []
    for i in range(n):
        author, created_at, content = i % AUTHORS, events.BASE_TS + i, f'{{"name":"v{i}"}}'
        id_ = events.event_id(pubkeys[author], created_at, 0, [], content)
        sig = keys[author].sign_schnorr(bytes.fromhex(id_)).hex()
        lines.append(orjson.dumps({"id": id_, "pubkey": pubkeys[author], "created_at": created_at, "kind": 0,
                                   "tags": [], "content": content, "sig": sig}))
    return lines


async def run(lines: list[bytes], rounds: int) -> dict:
    """Submit `lines` into a fresh store; the writer's and the wall's seconds per event, and the feed's read rate."""
    limits, now = EventLimits(), time.time() + 10 * 365 * 86400  # bench events lie in the future of BASE_TS
    parsed = [parse_event(orjson.loads(line), limits, now) for line in lines]
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(None, {}, {"store": {"path": str(Path(tmp) / "bench.db")}})
        writer = [0.0, 0]

        def on_batch(count: int, seconds: float) -> None:
            writer[0] += seconds
            writer[1] += 1

        store = await open_store(config, read_connections=1, on_batch=on_batch)
        started = time.perf_counter()
        for start in range(0, len(parsed), rounds):
            await asyncio.gather(*(store.submit(e) for e in parsed[start:start + rounds]))
        wall = time.perf_counter() - started
        result = {"events": len(parsed), "transactions": writer[1], "writer_us_per_event": writer[0] / len(parsed) * 1e6,
                  "wall_us_per_event": wall / len(parsed) * 1e6}
        if hasattr(store, "changes"):  # the tree has the change feed
            started, cursor, read = time.perf_counter(), 0, 0
            while page := await store.changes(cursor, 1000):
                cursor, read = page[-1].cursor, read + len(page)
            result["feed_changes"] = read
            result["feed_reads_per_second"] = read / (time.perf_counter() - started)
        await store.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="events per workload")
    ap.add_argument("--round", type=int, default=4096, dest="rounds", help="events submitted at once")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    results = {"mix": asyncio.run(run(events.load(args.n), args.rounds)),
               "replace": asyncio.run(run(replace_lines(args.n), args.rounds))}
    for name, r in results.items():
        feed = (f", feed read back {r['feed_changes']} changes at {r['feed_reads_per_second']:,.0f}/s"
                if "feed_changes" in r else ", no change feed in this tree")
        print(f"{name:8} {r['events']} events in {r['transactions']} transactions: writer "
              f"{r['writer_us_per_event']:.1f} µs/event, wall {r['wall_us_per_event']:.1f} µs/event{feed}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
