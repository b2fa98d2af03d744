"""Projector costs, run on demand: ingest through the Store with and without the built-in projectors, and
start-up time on a 1,000,000-event store (unchanged projectors, then one revision bump).

    .venv/bin/python bench/projectors.py [--n 50000] [--reps 3] [--big 1000000] [--skip-ingest] [--skip-startup]

Ingest: the same signed bench events (bench/events.py, seed 1; validated once with `parse_event`,
signatures not re-checked: that cost is the same in both runs) are written through `Store.submit`
in chunks of 4,096 into a fresh database, alternately with no hook and with the four built-in
projectors; medians of `--reps` runs each, and their ratio.

Start-up: signing 1M events takes minutes, so the big store is made with SQL inserts of synthetic
rows into `events` (canonical JSON, random ids, dummy signatures; kinds 0 / 3 / 10002 / 30023 with
distinct authors, notes and reactions for the rest; no tag index rows, which projectors never read),
cached in bench/results/cache/.  Then: first open with the projectors (builds all four), a reopen
with unchanged specs, and a reopen with `profiles` at revision 2.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import sqlite3
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

from relay.logging import configure_logging  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.store.projectors import BUILTIN_PROJECTORS, ProjectorHook  # noqa: E402
from relay.store.store import Store, StoreOptions  # noqa: E402

CACHE = BENCH / "results" / "cache"
CHUNK = 4096
OPTIONS = StoreOptions(read_connections=1)


# ---------------------------------------------------------------- ingest

async def _ingest_once(events: list, with_projectors: bool, workdir: Path) -> float:
    path = workdir / ("p.db" if with_projectors else "n.db")
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    hooks = [ProjectorHook(BUILTIN_PROJECTORS)] if with_projectors else []
    store = await Store.open(path, OPTIONS, hooks)
    started, cpu_started = time.perf_counter(), time.process_time()
    for i in range(0, len(events), CHUNK):
        await asyncio.gather(*[store.submit(e) for e in events[i:i + CHUNK]])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await store.close()
    return len(events) / elapsed, cpu


def bench_ingest(n: int, reps: int) -> dict:
    """Median events/s and CPU seconds of `reps` ingests of the first `n` bench events, without and with the
    built-in projectors (alternating order), and the slowdown in percent."""
    lines = bench_events.load(n, quiet=True)
    limits = EventLimits(max_created_at_future_seconds=10**10)
    now = time.time()
    events = [parse_event(orjson.loads(line), limits, now) for line in lines]
    kinds = {}
    for e in events:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    results: dict[str, list[float]] = {"none": [], "builtin": []}
    cpu: dict[str, list[float]] = {"none": [], "builtin": []}
    with tempfile.TemporaryDirectory(dir=BENCH / "results") as tmp:
        for rep in range(reps):
            for label in (("none", "builtin") if rep % 2 == 0 else ("builtin", "none")):
                eps, seconds = asyncio.run(_ingest_once(events, label == "builtin", Path(tmp)))
                results[label].append(eps)
                cpu[label].append(seconds)
                print(f"  ingest rep {rep + 1} {label:8s} {eps:10,.0f} events/s, {seconds:6.2f} s CPU",
                      file=sys.stderr)
    none, builtin = statistics.median(results["none"]), statistics.median(results["builtin"])
    cpu_none, cpu_builtin = statistics.median(cpu["none"]), statistics.median(cpu["builtin"])
    return {"events": n, "kinds": dict(sorted(kinds.items())), "reps": reps,
            "none_eps": round(none), "builtin_eps": round(builtin),
            "slowdown_pct": round(100 * (1 - builtin / none), 1),
            # CPU seconds of the whole process (loop + writer thread): steadier than wall time on a shared machine
            "cpu_none_s": round(cpu_none, 2), "cpu_builtin_s": round(cpu_builtin, 2),
            "cpu_overhead_pct": round(100 * (cpu_builtin / cpu_none - 1), 1),
            "all": {k: [round(v) for v in vs] for k, vs in results.items()}}


# ---------------------------------------------------------------- the 1M-event store

def _row(rng: random.Random, i: int, kind: int, pubkey: str, created_at: int) -> tuple:
    tags: list = []
    content = ""
    d_tag = None
    if kind == 0:
        content = json.dumps({"name": f"user{i}", "about": "synthetic profile " * 3, "picture": f"https://p/{i}.png",
                              "nip05": f"user{i}@example.com"})
        d_tag = ""
    elif kind == 3:
        tags = [["p", f"{rng.getrandbits(256):064x}", "wss://relay.example.com"] for _ in range(rng.randrange(10, 60))]
        d_tag = ""
    elif kind == 10002:
        tags = [["r", f"wss://relay{n}.example.com", rng.choice(["read", "write"])] for n in range(rng.randrange(2, 8))]
        d_tag = ""
    elif kind == 30023:
        d_tag = f"article-{i}"
        tags = [["d", d_tag], ["title", f"Article {i}"], ["published_at", str(created_at)]]
        content = "long form " * 50
    elif kind == 7:
        tags = [["e", f"{rng.getrandbits(256):064x}"], ["p", f"{rng.getrandbits(256):064x}"]]
        content = "+"
    else:
        tags = [["p", f"{rng.getrandbits(256):064x}"]] if rng.random() < 0.5 else []
        content = "synthetic note " * rng.randrange(1, 8)
    event_id = os.urandom(32)
    raw = orjson.dumps({"id": event_id.hex(), "pubkey": pubkey, "created_at": created_at, "kind": kind,
                        "tags": tags, "content": content, "sig": "00" * 64}).decode()
    return (event_id, bytes.fromhex(pubkey), created_at, kind, d_tag, None, "", raw)


def build_big_store(n: int) -> Path:
    """A migrated store with `n` synthetic events (cached); returns its path."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"projectors-synthetic-{n}.db"
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp.db")
    for suffix in ("", "-wal", "-shm"):
        Path(str(tmp) + suffix).unlink(missing_ok=True)

    async def migrate():
        """Create the schema through the Store (migrations)."""
        await (await Store.open(tmp, OPTIONS)).close()

    asyncio.run(migrate())
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    rng = random.Random(1)
    authors = [f"{rng.getrandbits(256):064x}" for _ in range(5000)]
    started = time.perf_counter()
    conn.execute("BEGIN")
    batch = []
    for i in range(n):
        roll = rng.random()
        kind = 0 if roll < 0.03 else 3 if roll < 0.07 else 10002 if roll < 0.08 else 30023 if roll < 0.09 \
            else 7 if roll < 0.3 else 1
        # replaceable / addressable: a fresh author each, so every coordinate holds one live event
        pubkey = f"{rng.getrandbits(256):064x}" if kind in (0, 3, 10002) else rng.choice(authors)
        batch.append(_row(rng, i, kind, pubkey, 1_700_000_000 + i))
        if len(batch) >= 20_000:
            conn.executemany("INSERT INTO events (id, pubkey, created_at, kind, d_tag, expiration, origin, raw)"
                             " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch)
            batch.clear()
            print(f"  synthetic store: {i + 1:,} events ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if batch:
        conn.executemany("INSERT INTO events (id, pubkey, created_at, kind, d_tag, expiration, origin, raw)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.replace(tmp, path)
    for suffix in ("-wal", "-shm"):
        Path(str(tmp) + suffix).unlink(missing_ok=True)
    return path


async def _timed_open(path: Path, specs) -> tuple[float, float, list]:
    hook = ProjectorHook(specs) if specs else None
    started = time.perf_counter()
    store = await Store.open(path, OPTIONS, [hook] if hook else [])
    opened = time.perf_counter() - started
    await store.close()
    return opened, time.perf_counter() - started, hook.rebuilt if hook else []


def bench_startup(n: int) -> dict:
    """Seconds of `Store.open` on a copy of the `n`-event store: no projectors, first open (builds all four),
    unchanged (3 times), profiles at revision 2, follows at revision 2; and the rows of each table."""
    source = build_big_store(n)
    out: dict = {"events": n}
    with tempfile.TemporaryDirectory(dir=BENCH / "results") as tmp:
        path = Path(tmp) / "big.db"
        shutil.copy(source, path)
        conn = sqlite3.connect(path)
        out["by_kind"] = dict(conn.execute("SELECT kind, count(*) FROM events WHERE kind IN (0, 3, 10002, 30023)"
                                           " GROUP BY kind").fetchall())
        conn.close()
        out["open_no_projectors_s"] = round(asyncio.run(_timed_open(path, ()))[0], 3)
        first, _, rebuilt = asyncio.run(_timed_open(path, BUILTIN_PROJECTORS))
        out["first_open_builds_all_s"] = round(first, 2)
        assert len(rebuilt) == 4, rebuilt
        times = []
        for _ in range(3):
            opened, _, rebuilt = asyncio.run(_timed_open(path, BUILTIN_PROJECTORS))
            assert rebuilt == [], rebuilt
            times.append(opened)
        out["open_unchanged_s"] = [round(t, 3) for t in times]
        bumped = (dataclasses.replace(BUILTIN_PROJECTORS[0], revision=2), *BUILTIN_PROJECTORS[1:])
        opened, _, rebuilt = asyncio.run(_timed_open(path, bumped))
        assert rebuilt == [("profiles", "revision 1 -> 2")], rebuilt
        out["open_after_profiles_revision_bump_s"] = round(opened, 3)
        bumped = (*BUILTIN_PROJECTORS[:1], dataclasses.replace(BUILTIN_PROJECTORS[1], revision=2),
                  *BUILTIN_PROJECTORS[2:])
        opened, _, rebuilt = asyncio.run(_timed_open(path, (BUILTIN_PROJECTORS[0], *bumped[1:])))
        out["open_after_follows_revision_bump_s"] = round(opened, 3)
        conn = sqlite3.connect(path)
        out["rows"] = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                       for t in ("profiles", "follows", "relay_lists", "articles")}
        conn.close()
    return out


def main() -> None:
    """Run the benchmarks asked for, print one line each, write bench/results/projectors-<stamp>.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="signed events to ingest per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per configuration (medians reported)")
    parser.add_argument("--big", type=int, default=1_000_000, help="events in the start-up store")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-startup", action="store_true")
    args = parser.parse_args()
    configure_logging("warning", "console")
    report = {}
    if not args.skip_ingest:
        report["ingest"] = bench_ingest(args.n, args.reps)
        i = report["ingest"]
        print(f"ingest {i['events']:,} events: no projectors {i['none_eps']:,} events/s, built-in projectors "
              f"{i['builtin_eps']:,} events/s -> {i['slowdown_pct']}% slower (target < 15%); CPU "
              f"{i['cpu_none_s']} s vs {i['cpu_builtin_s']} s -> +{i['cpu_overhead_pct']}%")
    if not args.skip_startup:
        report["startup"] = bench_startup(args.big)
        s = report["startup"]
        print(f"start-up on {s['events']:,} events: no projectors {s['open_no_projectors_s']} s; first open "
              f"(builds all four) {s['first_open_builds_all_s']} s; unchanged {s['open_unchanged_s']} s "
              f"(target < 1 s); profiles revision bump {s['open_after_profiles_revision_bump_s']} s; follows "
              f"revision bump {s['open_after_follows_revision_bump_s']} s; rows {s['rows']}")
    out = BENCH / "results" / f"projectors-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
