"""NIP-50 search costs, run on demand: query latency by query shape and limit, and the ingest cost of the index.

    .venv/bin/python bench/search.py [--n 100000] [--reps 3] [--queries 200] [--no-real]

Events: the first `--n` signed bench events (bench/events.py, seed 1; kind 1 notes of 3-50 words from a
~90-word vocabulary plus a few accented and CJK words, kind 0 profiles, reactions, follow lists) plus the real
events of ../shared/data/all_real_valid_dedup.jsonl (`--no-real` leaves them out); validated once with
`parse_event` (signatures not re-checked: the same in both runs).

Ingest: the events are written through `Store.submit` in chunks of 4,096 into a fresh database with the hooks
`relay serve` would have with the default configuration, alternately with `[search] enabled = false` and
`true` (same run, `--reps` times each): median events/s and CPU seconds, the slowdown, and the file sizes.

Queries: on the store with the index, `Store.query` (the read path of a REQ: one read connection, the SQL,
the merge) of `--queries` searches of each shape, drawn from the vocabulary with a fixed seed: one word, two
words, a two-word phrase taken from a stored note, a three-letter prefix; each with limit 20 and limit 500.
p50/p99 in milliseconds and the median rows returned.  Results go to bench/results/search-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import events as bench_events  # noqa: E402
from common import percentile  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.hooks import hooks  # noqa: E402
from relay.logging import configure_logging  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.protocol.filters import parse_filter  # noqa: E402
from relay.protocol.rejection import Rejection  # noqa: E402
from relay.store.store import Store  # noqa: E402

REAL = BENCH.parent.parent / "shared" / "data" / "all_real_valid_dedup.jsonl"
CHUNK = 4096
LIMITS = (20, 500)


def load_events(n: int, real: bool) -> list:
    """The first `n` bench events and (if `real`) the real ones, as validated Events (those that parse)."""
    lines = bench_events.load(n, quiet=True) if n else []
    if real and REAL.exists():
        lines += [line for line in REAL.read_bytes().split(b"\n") if line.strip()]
    limits, now, events = EventLimits(max_created_at_future_seconds=10**10), time.time(), []
    for line in lines:
        try:
            events.append(parse_event(orjson.loads(line), limits, now))
        except Rejection:
            pass
    return events


def config_for(path: Path, search: bool):
    return load_config(None, {}, {"store": {"path": str(path), "read_connections": 1}, "search": {"enabled": search}})


async def ingest(events: list, path: Path, search: bool) -> tuple[float, float, int]:
    """(events/s, CPU seconds, database bytes) of writing `events` into a fresh store at `path`."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    config = config_for(path, search)
    store = await Store.open(path, config.store.options(1), hooks(config))
    started, cpu_started = time.perf_counter(), time.process_time()
    for i in range(0, len(events), CHUNK):
        await asyncio.gather(*[store.submit(e) for e in events[i:i + CHUNK]])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await store.close()
    size = sum(Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists())
    return len(events) / elapsed, cpu, size


def bench_ingest(events: list, reps: int, workdir: Path) -> dict:
    """Median events/s, CPU seconds and database size without and with the search index (alternating order)."""
    runs: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for rep in range(reps):
        for search in ((False, True) if rep % 2 == 0 else (True, False)):
            eps, cpu, size = asyncio.run(ingest(events, workdir / f"search-{search}.db", search))
            runs[search].append((eps, cpu, size))
            print(f"  ingest rep {rep + 1} search={search!s:5} {eps:9,.0f} events/s {cpu:6.2f} s CPU "
                  f"{size / 1e6:7.1f} MB", file=sys.stderr)
    med = {s: [statistics.median(r[k] for r in runs[s]) for k in range(3)] for s in runs}
    return {"events": len(events), "reps": reps,
            "without_eps": round(med[False][0]), "with_eps": round(med[True][0]),
            "slowdown_pct": round(100 * (1 - med[True][0] / med[False][0]), 1),
            "cpu_without_s": round(med[False][1], 2), "cpu_with_s": round(med[True][1], 2),
            "cpu_overhead_pct": round(100 * (med[True][1] / med[False][1] - 1), 1),
            "db_without_mb": round(med[False][2] / 1e6, 1), "db_with_mb": round(med[True][2] / 1e6, 1)}


def query_texts(events: list, count: int) -> dict[str, list[str]]:
    """`count` search texts of each shape, drawn with seed 1 from the bench vocabulary and the stored notes."""
    rng = random.Random(1)
    words = bench_events.WORDS
    notes = [e.content.split() for e in events if e.kind == 1 and len(e.content.split()) > 2]
    phrases = []
    for _ in range(count):
        note = rng.choice(notes)
        k = rng.randrange(len(note) - 1)
        phrases.append('"' + " ".join(note[k:k + 2]).replace('"', "") + '"')
    return {"one word": [rng.choice(words) for _ in range(count)],
            "two words": [f"{rng.choice(words)} {rng.choice(words)}" for _ in range(count)],
            "phrase": phrases,
            "prefix": [rng.choice([w for w in words if len(w) >= 3])[:3] + "*" for _ in range(count)]}


async def bench_queries(path: Path, texts: dict[str, list[str]]) -> dict:
    """p50/p99 milliseconds and median rows of each shape and limit, through `Store.query`."""
    config = config_for(path, True)
    store = await Store.open(path, config.store.options(1), hooks(config))
    report = {}
    try:
        for shape, queries in texts.items():
            for limit in LIMITS:
                times, rows = [], []
                for text in queries:
                    f = parse_filter({"search": text, "limit": limit})
                    started = time.perf_counter()
                    got = await store.query([f], 500, 5000, max_rows=10_000)
                    times.append((time.perf_counter() - started) * 1000)
                    rows.append(len(got))
                times.sort()
                report[f"{shape}, limit {limit}"] = {"p50_ms": round(percentile(times, 0.5), 2),
                                                     "p99_ms": round(percentile(times, 0.99), 2),
                                                     "rows_median": statistics.median(rows)}
    finally:
        await store.close()
    return report


def main() -> None:
    """Run both parts, print the tables, write bench/results/search-<stamp>.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="generated events (plus the real ones)")
    parser.add_argument("--reps", type=int, default=3, help="ingest runs per configuration (medians reported)")
    parser.add_argument("--queries", type=int, default=200, help="searches per shape and limit")
    parser.add_argument("--no-real", action="store_true", help="leave out the real events of ../shared/data")
    args = parser.parse_args()
    configure_logging("warning", "console")
    events = load_events(args.n, not args.no_real)
    (BENCH / "results").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BENCH / "results") as tmp:
        report = {"ingest": bench_ingest(events, args.reps, Path(tmp))}
        report["queries"] = asyncio.run(bench_queries(Path(tmp) / "search-True.db", query_texts(events, args.queries)))
    i = report["ingest"]
    print(f"ingest {i['events']:,} events: without the index {i['without_eps']:,} events/s, with it "
          f"{i['with_eps']:,} events/s -> {i['slowdown_pct']}% slower; CPU {i['cpu_without_s']} s vs "
          f"{i['cpu_with_s']} s -> +{i['cpu_overhead_pct']}%; database {i['db_without_mb']} MB vs {i['db_with_mb']} MB")
    print(f"{'query':28} {'p50 ms':>8} {'p99 ms':>8} {'rows':>6}")
    for name, q in report["queries"].items():
        print(f"{name:28} {q['p50_ms']:8.2f} {q['p99_ms']:8.2f} {q['rows_median']:6}")
    out = BENCH / "results" / f"search-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
