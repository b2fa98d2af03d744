"""NIP-50 search costs, run on demand: query latency by query shape and limit, and the ingest cost of the index,
with the relay's CJK bigrams ("new") against unicode61 alone ("old", each CJK run one token) and search off.

    .venv/bin/python bench/search.py [--n 100000] [--cjk 20000] [--reps 3] [--queries 200] [--no-real]

Events: the first `--n` signed bench events (bench/events.py, seed 1; kind 1 notes of 3-50 words from a
~90-word vocabulary plus a few accented and CJK words, kind 0 profiles, reactions, follow lists), `--cjk`
kind 1 notes of 2-12 CJK runs taken at random (seed 1) from the real notes' runs, joined by `、`, `。`, a space
or a vocabulary word (signed here), plus the real events of ../shared/data/all_real_valid_dedup.jsonl
(`--no-real` leaves them out); validated once with `parse_event` (signatures not re-checked).

"old" is the tokenization before CJK bigrams, selectable in this bench only: `cjk_bigrams` and the query's
`_cjk_phrase` are replaced by the identity for the run (`tokenization`), which is what the relay did before.

Ingest: the events are written through `Store.submit` in chunks of 4,096 into a fresh database with the hooks
`relay serve` would have with the default configuration, with search off, old and new in turn (the order
rotated each rep, `--reps` times each): median events/s and CPU seconds, the file size, and the bytes of the
FTS5 tables (dbstat).

Queries: on each store with an index, `Store.query` (the read path of a REQ: one read connection, the SQL,
the merge) of `--queries` searches of each shape, drawn with a fixed seed: Latin ones from the vocabulary (one
word, two words, a two-word phrase taken from a stored note, a three-letter prefix) and CJK ones from the CJK
runs of the stored notes (a two-character and a three-character word taken inside a run, a single character);
each with limit 20 and limit 500.  p50/p99 in milliseconds and the median rows returned (the old tokenization
finds a CJK word only when it is a whole run).  Results go to bench/results/search-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
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

import events as bench_events  # noqa: E402
from common import percentile  # noqa: E402

from relay.config import load_config  # noqa: E402
from relay.hooks import hooks  # noqa: E402
from relay.logging import configure_logging  # noqa: E402
from relay.protocol.event import EventLimits, parse_event  # noqa: E402
from relay.protocol.filters import parse_filter  # noqa: E402
from relay.protocol import search as search_protocol  # noqa: E402
from relay.protocol.rejection import Rejection  # noqa: E402
from relay.store.search import text as search_text  # noqa: E402
from relay.store.search.index import TABLE  # noqa: E402
from relay.store.store import Store  # noqa: E402

REAL = BENCH.parent.parent / "shared" / "data" / "all_real_valid_dedup.jsonl"
CHUNK = 4096
LIMITS = (20, 500)
MODES = ("off", "old", "new")
"""Search disabled; unicode61 alone (before CJK bigrams); the relay's tokenization."""
CJK_KEY = PrivateKey(hashlib.sha256(b"bench-search-cjk").digest())


@contextlib.contextmanager
def tokenization(mode: str):
    """Run with the relay's CJK bigrams ("new", "off") or without them ("old": a CJK run is one token)."""
    if mode != "old":
        yield
        return
    saved = search_text.cjk_bigrams, search_protocol._cjk_phrase
    search_text.cjk_bigrams, search_protocol._cjk_phrase = (lambda text: text), (lambda text: (text, False))
    try:
        yield
    finally:
        search_text.cjk_bigrams, search_protocol._cjk_phrase = saved


def cjk_runs(events: list) -> list[str]:
    """The CJK runs of the contents of the kind 1 and kind 0 `events`, in order."""
    return [run for e in events if e.kind in (0, 1) for run in search_protocol.CJK_RUN.findall(e.content)]


def cjk_notes(count: int, runs: list[str]) -> list[bytes]:
    """`count` signed kind 1 notes of 2-12 of `runs` (seed 1), joined by CJK punctuation, a space or a word."""
    rng, pubkey = random.Random(1), CJK_KEY.public_key_xonly.format().hex()
    notes = []
    for i in range(count if runs else 0):
        parts = [rng.choice(runs)]
        for _ in range(rng.randint(1, 11)):
            parts += [rng.choice(["、", "。", " ", f" {rng.choice(bench_events.WORDS)} "]), rng.choice(runs)]
        content, created_at = "".join(parts), bench_events.BASE_TS + i
        serial = json.dumps([0, pubkey, created_at, 1, [], content], separators=(",", ":"), ensure_ascii=False)
        event_id = hashlib.sha256(serial.encode()).hexdigest()
        notes.append(orjson.dumps({"id": event_id, "pubkey": pubkey, "created_at": created_at, "kind": 1, "tags": [],
                                   "content": content,
                                   "sig": CJK_KEY.sign_schnorr(bytes.fromhex(event_id)).hex()}))
    return notes


def parse_lines(lines: list[bytes]) -> list:
    """The validated Events of JSON `lines` (those that parse)."""
    limits, now, events = EventLimits(max_created_at_future_seconds=10**10), time.time(), []
    for line in lines:
        try:
            events.append(parse_event(orjson.loads(line), limits, now))
        except Rejection:
            pass
    return events


def load_events(n: int, cjk: int, real: bool) -> list:
    """The first `n` bench events, `cjk` CJK notes made of the real notes' runs and (if `real`) the real events."""
    real_events = parse_lines([line for line in REAL.read_bytes().split(b"\n") if line.strip()]) if REAL.exists() else []
    return parse_lines(bench_events.load(n, quiet=True) if n else []) + parse_lines(
        cjk_notes(cjk, cjk_runs(real_events))) + (real_events if real else [])


def config_for(path: Path, search: bool):
    return load_config(None, {}, {"store": {"path": str(path), "read_connections": 1}, "search": {"enabled": search}})


def fts_bytes(path: Path) -> int:
    """Bytes of the pages of the search index's FTS5 tables (and their indexes) in the database at `path`."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name LIKE ?",
                            (f"{TABLE}%",)).fetchone()[0]
    finally:
        conn.close()


async def ingest(events: list, path: Path, mode: str) -> tuple[float, float, int, int]:
    """(events/s, CPU seconds, database bytes, FTS5 bytes) of writing `events` into a fresh store at `path`."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    config = config_for(path, mode != "off")
    with tokenization(mode):
        store = await Store.open(path, config.store.options(1), hooks(config))
        started, cpu_started = time.perf_counter(), time.process_time()
        for i in range(0, len(events), CHUNK):
            await asyncio.gather(*[store.submit(e) for e in events[i:i + CHUNK]])
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        await store.close()
    size = sum(Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists())
    return len(events) / elapsed, cpu, size, fts_bytes(path)


def bench_ingest(events: list, reps: int, workdir: Path) -> dict:
    """Median events/s, CPU seconds, database and FTS5 bytes with search off, old and new (order rotated)."""
    runs: dict[str, list[tuple[float, float, int, int]]] = {mode: [] for mode in MODES}
    for rep in range(reps):
        for mode in MODES[rep % 3:] + MODES[:rep % 3]:
            eps, cpu, size, fts = asyncio.run(ingest(events, workdir / f"search-{mode}.db", mode))
            runs[mode].append((eps, cpu, size, fts))
            print(f"  ingest rep {rep + 1} search={mode:3} {eps:9,.0f} events/s {cpu:6.2f} s CPU "
                  f"{size / 1e6:7.1f} MB, FTS5 {fts / 1e6:6.2f} MB", file=sys.stderr)
    report = {"events": len(events), "reps": reps}
    for mode, rows in runs.items():
        eps, cpu, size, fts = (statistics.median(r[k] for r in rows) for k in range(4))
        report[mode] = {"eps": round(eps), "cpu_s": round(cpu, 2), "db_mb": round(size / 1e6, 2),
                        "fts_mb": round(fts / 1e6, 2)}
    return report


def query_texts(events: list, count: int) -> dict[str, list[str]]:
    """`count` search texts of each shape, drawn with seed 1 from the bench vocabulary and the stored notes
    (Latin), and from the CJK runs of the stored notes (CJK)."""
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
            "prefix": [rng.choice([w for w in words if len(w) >= 3])[:3] + "*" for _ in range(count)],
            **cjk_query_texts(cjk_runs(events), count, rng)}


def cjk_query_texts(runs: list[str], count: int, rng: random.Random) -> dict[str, list[str]]:
    """`count` CJK words of 2 and of 3 characters taken inside `runs`, and single characters."""
    def inside(length: int) -> list[str]:
        long_enough = [r for r in runs if len(r) >= length]
        words = []
        for _ in range(count if long_enough else 0):
            run = rng.choice(long_enough)
            start = rng.randrange(len(run) - length + 1)
            words.append(run[start:start + length])
        return words
    return {"CJK 2 chars": inside(2), "CJK 3 chars": inside(3), "CJK 1 char": inside(1)}


async def bench_queries(path: Path, texts: dict[str, list[str]]) -> dict:
    """p50/p99 milliseconds and median rows of each shape and limit, through `Store.query`."""
    config = config_for(path, True)
    store = await Store.open(path, config.store.options(1), hooks(config))
    report = {}
    try:
        for shape, queries in ((shape, queries) for shape, queries in texts.items() if queries):
            for limit in LIMITS:
                times, rows = [], []
                for text in queries:
                    try:
                        f = parse_filter({"search": text, "limit": limit})
                    except Rejection:  # a phrase of a real note with no word in it (emoji only)
                        continue
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
    parser.add_argument("--cjk", type=int, default=20_000, help="CJK notes made of the real notes' CJK runs")
    parser.add_argument("--reps", type=int, default=3, help="ingest runs per configuration (medians reported)")
    parser.add_argument("--queries", type=int, default=200, help="searches per shape and limit")
    parser.add_argument("--no-real", action="store_true", help="leave out the real events of ../shared/data")
    args = parser.parse_args()
    configure_logging("warning", "console")
    events = load_events(args.n, args.cjk, not args.no_real)
    texts = query_texts(events, args.queries)
    (BENCH / "results").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BENCH / "results") as tmp:
        report = {"ingest": bench_ingest(events, args.reps, Path(tmp)), "queries": {}}
        for mode in MODES[1:]:
            with tokenization(mode):
                report["queries"][mode] = asyncio.run(bench_queries(Path(tmp) / f"search-{mode}.db", texts))
    i = report["ingest"]
    print(f"ingest {i['events']:,} events, median of {i['reps']}:")
    print(f"{'search':8} {'events/s':>10} {'CPU s':>7} {'db MB':>8} {'FTS5 MB':>8}")
    for mode in MODES:
        m = i[mode]
        print(f"{mode:8} {m['eps']:10,} {m['cpu_s']:7.2f} {m['db_mb']:8.2f} {m['fts_mb']:8.2f}")
    print(f"{'query':28} {'old p50':>8} {'p99':>8} {'rows':>6} {'new p50':>8} {'p99':>8} {'rows':>6}  (ms)")
    old, new = report["queries"]["old"], report["queries"]["new"]
    for name in new:
        print(f"{name:28} " + " ".join(f"{q['p50_ms']:8.2f} {q['p99_ms']:8.2f} {q['rows_median']:6}"
                                       for q in (old[name], new[name])))
    out = BENCH / "results" / f"search-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), **report}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
