"""Retention costs, run on demand: how fast a run removes events, and what it does to writers meanwhile.

    .venv/bin/python bench/retention.py [--n 100000] [--batch 500] [--writes 2000]

A fresh Store with the configured hooks (four built-in projectors, negentropy index) is filled with `--n`
synthetic kind-1 events (valid ids, dummy signatures: the Store never checks signatures) spread over 100
days.  Then a retention rule `max_age_days = 50` removes about half of them while a writer submits
`--writes` new events one at a time; printed: events removed per second, steps, and the writer's submit
latency (p50, p99, max) during the run and, for reference, alone.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import events  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.hooks import hooks  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.retention import run_retention  # noqa: E402
from relay.store.store import Store  # noqa: E402

DAY = 86_400
LIMITS = EventLimits(10_000, 262_144, 900)


def synthetic(i: int, created_at: int) -> dict:
    """A kind-1 event with a valid id and a dummy signature (never verified by the Store)."""
    pubkey = hashlib.sha256(b"author%d" % (i % 1000)).hexdigest()
    tags = [["t", f"topic{i % 50}"]]
    content = f"note {i}"
    return {"id": events.event_id(pubkey, created_at, 1, tags, content), "pubkey": pubkey, "created_at": created_at,
            "kind": 1, "tags": tags, "content": content, "sig": "00" * 64}


async def writer_latencies(store: Store, count: int, start: int, stop: asyncio.Event | None) -> list[float]:
    """Submit up to `count` new events one at a time (until `stop` is set, if given); seconds each."""
    now = int(time.time())
    seconds = []
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        event = parse_event(synthetic(start + i, now), LIMITS, now)
        t0 = time.perf_counter()
        accepted, message = await store.submit(event)
        seconds.append(time.perf_counter() - t0)
        assert accepted, message
    return seconds


def describe(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p50, p99 = common.percentile(ordered, 0.5), common.percentile(ordered, 0.99)
    return (f"{len(ordered)} submits: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
            f"max {ordered[-1] * 1000:.2f} ms")


async def main(n: int, batch: int, writes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(None, {}, {"store": {"path": str(Path(tmp) / "relay.db")},
                                        "retention": {"rules": [{"max_age_days": 50}], "batch_size": batch}})
        store = await Store.open(config.store.path, config.store.options(), hooks(config))
        try:
            now = int(time.time())
            events = [parse_event(synthetic(i, now - 100 * DAY + i * (100 * DAY // n)), LIMITS, now)
                      for i in range(n)]
            for start in range(0, n, 4096):
                await asyncio.gather(*(store.submit(e) for e in events[start:start + 4096]))
            del events
            alone = await writer_latencies(store, writes, n, None)
            stop = asyncio.Event()
            writer = asyncio.create_task(writer_latencies(store, 1 << 30, n + writes, stop))
            t0 = time.perf_counter()
            report = await run_retention(store, config)
            elapsed = time.perf_counter() - t0
            stop.set()
            during = await writer
        finally:
            await store.close()
    print(f"retention: {report.evicted} of {n} events removed in {elapsed:.2f} s "
          f"({report.evicted / elapsed:,.0f} events/s), {report.steps} steps of <= {batch} rows")
    print(f"writer alone:          {describe(alone)}")
    print(f"writer during the run: {describe(during)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="events stored before the run")
    parser.add_argument("--batch", type=int, default=100, help="[retention] batch_size")
    parser.add_argument("--writes", type=int, default=2_000, help="submits measured with no run going on")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.batch, args.writes))
