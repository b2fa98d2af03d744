"""Seeded generator of signed Nostr events for the benchmarks.

    .venv/bin/python bench/events.py --n 100000 [--seed 1] [--authors 1000] [--verify 200]

The stream for a given (seed, authors) is fixed and prefix-stable: the first 50,000 events
of a 100,000 run are the 50,000 run.  Events are planned in the parent (content, tags,
created_at, id) and signed (BIP-340 Schnorr, coincurve) in a multiprocessing pool, then
cached as one compact JSON object per line in bench/results/events-*.jsonl, so signing
happens once.  `load(n, seed, authors)` returns the raw JSON lines (bytes) and reuses any
cached file of the same seed/authors with at least n events.

Mix (per event, by weight): kind 1 notes 78% (about half are replies carrying NIP-10
`e` root/reply markers and `p` tags of the authors replied to, others are roots, a quarter
of which mention 1-3 authors with `p`), kind 7 reactions 15% (`e`, `p`, `k`),
kind 3 follow lists 4% (10-100 `p` tags), kind 0 metadata 3%.  Author activity and
mention targets are Zipf-like, so a few authors have thousands of notes, a few threads
have thousands of replies, and a few pubkeys are mentioned thousands of times.
created_at advances ~20 s per event from BASE_TS (2026-08-29), so 100k events span
~23 days; override with BENCH_BASE_TS if a relay rejects old events.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path

import orjson
from coincurve import PrivateKey, PublicKeyXOnly

RESULTS = Path(__file__).resolve().parent / "results"
FORMAT_VERSION = 1
BASE_TS = int(os.environ.get("BENCH_BASE_TS", "1788000000"))
STEP = 20  # mean seconds between consecutive events

WORDS = (
    "nostr relay note zap sats bitcoin lightning freedom protocol client key sign event "
    "thread reply follow mute list pubkey npub gm gn coffee pleb build ship code python "
    "rust sqlite index query filter subscription websocket tag kind content hello world "
    "today yesterday tomorrow music photo cat dog mountain ocean rain sun moon book read "
    "write think idea great good bad funny weird true false maybe yes no why how what when"
).split()
EXTRA = ["café", "naïve", "日本語", "Ünïcödé", "🤙", "⚡", "🧡", "😂", "über", "señor"]
REACTIONS = ["+", "+", "+", "🤙", "❤️", "-", "⚡"]


def author_secret(seed: int, i: int) -> bytes:
    return hashlib.sha256(f"bench-author:{seed}:{i}".encode()).digest()


def event_id(pubkey: str, created_at: int, kind: int, tags: list, content: str) -> str:
    ser = json.dumps([0, pubkey, created_at, kind, tags, content],
                     separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(ser.encode()).hexdigest()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), rng.choice(EXTRA))
    s = " ".join(words)
    if rng.random() < 0.05:
        s += '\n"quoted" line with a \\ backslash'
    return s


def plan(n: int, seed: int, n_authors: int, base_ts: int = BASE_TS):
    """Yield (author_index, event_dict_without_sig) for the first n events of the stream."""
    rng = random.Random(seed)
    pubkeys = [PublicKeyXOnly.from_secret(author_secret(seed, i)).format().hex()
               for i in range(n_authors)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(n_authors)]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)

    def pick_author() -> int:
        return rng.choices(range(n_authors), cum_weights=cum)[0]

    roots: list[tuple[str, int]] = []         # (id, author) of root notes
    hot_roots: list[tuple[str, int]] = []     # first 20 roots become long threads
    thread_tail: dict[str, list[tuple[str, int]]] = {}
    recent_notes: list[tuple[str, int]] = []  # ring of recent kind-1 ids for reactions

    for i in range(n):
        a = pick_author()
        pk = pubkeys[a]
        created_at = base_ts + i * STEP + rng.randint(0, STEP - 1)
        r = rng.random()
        tags: list[list[str]]
        if r < 0.78 or not recent_notes:
            kind = 1
            if roots and rng.random() < 0.45:
                if hot_roots and rng.random() < 0.5:
                    root = rng.choice(hot_roots)
                else:
                    root = rng.choice(roots[-2000:])
                tail = thread_tail.setdefault(root[0], [])
                parent = rng.choice(tail[-5:]) if tail and rng.random() < 0.6 else root
                tags = [["e", root[0], "", "root"]]
                if parent is not root:
                    tags.append(["e", parent[0], "", "reply"])
                tags.append(["p", pubkeys[root[1]]])
                if parent[1] != root[1]:
                    tags.append(["p", pubkeys[parent[1]]])
                content = _text(rng, 3, 30)
                is_root = False
            else:
                tags = []
                if rng.random() < 0.25:
                    for _ in range(rng.randint(1, 3)):
                        tags.append(["p", pubkeys[pick_author()]])
                if rng.random() < 0.1:
                    tags.append(["t", rng.choice(WORDS)])
                content = _text(rng, 5, 50)
                is_root = True
        elif r < 0.93:
            kind = 7
            target = rng.choice(recent_notes)
            tags = [["e", target[0]], ["p", pubkeys[target[1]]], ["k", "1"]]
            content = rng.choice(REACTIONS)
        elif r < 0.97:
            kind = 3
            follows = rng.sample(range(n_authors), rng.randint(10, 100))
            tags = [["p", pubkeys[f]] for f in follows]
            content = ""
        else:
            kind = 0
            content = json.dumps({"name": f"user{a}", "about": _text(rng, 3, 15),
                                  "picture": f"https://example.invalid/{a}.png"},
                                 ensure_ascii=False)
            tags = []
        eid = event_id(pk, created_at, kind, tags, content)
        if kind == 1:
            recent_notes.append((eid, a))
            if len(recent_notes) > 5000:
                del recent_notes[:1000]
            if is_root:
                roots.append((eid, a))
                if len(hot_roots) < 20:
                    hot_roots.append((eid, a))
            else:
                thread_tail[tags[0][1]].append((eid, a))
        yield a, {"id": eid, "pubkey": pk, "created_at": created_at, "kind": kind,
                  "tags": tags, "content": content}


_SECRETS: list[bytes] = []


def _init_worker(seed: int, n_authors: int) -> None:
    global _SECRETS
    _SECRETS = [author_secret(seed, i) for i in range(n_authors)]


def _sign_chunk(chunk: list[tuple[int, str]]) -> list[str]:
    keys: dict[int, PrivateKey] = {}
    out = []
    for a, eid in chunk:
        k = keys.get(a)
        if k is None:
            k = keys[a] = PrivateKey(_SECRETS[a])
        out.append(k.sign_schnorr(bytes.fromhex(eid), b"\0" * 32).hex())
    return out


def cache_path(n: int, seed: int = 1, n_authors: int = 1000, base_ts: int = BASE_TS) -> Path:
    return RESULTS / f"events-v{FORMAT_VERSION}-s{seed}-a{n_authors}-b{base_ts}-n{n}.jsonl"


def _find_cached(n: int, seed: int, n_authors: int, base_ts: int = BASE_TS) -> Path | None:
    best = None
    prefix = f"events-v{FORMAT_VERSION}-s{seed}-a{n_authors}-b{base_ts}-n"
    for p in RESULTS.glob(prefix + "*.jsonl"):
        try:
            m = int(p.name[len(prefix):-len(".jsonl")])
        except ValueError:
            continue
        if m >= n and (best is None or m < best[0]):
            best = (m, p)
    return best[1] if best else None


def generate(n: int, seed: int = 1, n_authors: int = 1000, workers: int | None = None,
             quiet: bool = False, base_ts: int = BASE_TS) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    planned = list(plan(n, seed, n_authors, base_ts))
    t1 = time.perf_counter()
    workers = workers or os.cpu_count() or 1
    pairs = [(a, ev["id"]) for a, ev in planned]
    csize = 2000
    chunks = [pairs[i:i + csize] for i in range(0, len(pairs), csize)]
    with mp.get_context("fork").Pool(workers, _init_worker, (seed, n_authors)) as pool:
        sigs = [s for part in pool.map(_sign_chunk, chunks) for s in part]
    t2 = time.perf_counter()
    path = cache_path(n, seed, n_authors, base_ts)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for (_, ev), sig in zip(planned, sigs):
            ev["sig"] = sig
            f.write(orjson.dumps(ev))
            f.write(b"\n")
    os.replace(tmp, path)
    if not quiet:
        print(f"planned {n} events in {t1 - t0:.1f}s, signed in {t2 - t1:.1f}s "
              f"with {workers} processes -> {path}", file=sys.stderr)
    return path


def load(n: int, seed: int = 1, n_authors: int = 1000, quiet: bool = False,
         base_ts: int = BASE_TS) -> list[bytes]:
    """Return the first n events as raw JSON lines (bytes, no newline), generating if needed."""
    p = (_find_cached(n, seed, n_authors, base_ts)
         or generate(n, seed, n_authors, quiet=quiet, base_ts=base_ts))
    out = []
    with open(p, "rb") as f:
        for line in f:
            out.append(line.rstrip(b"\n"))
            if len(out) >= n:
                break
    return out


def exact_file(n: int, seed: int = 1, n_authors: int = 1000, base_ts: int = BASE_TS) -> Path:
    """A JSONL file holding exactly the first n events (for `relay import`)."""
    p = cache_path(n, seed, n_authors, base_ts)
    if not p.exists():
        lines = load(n, seed, n_authors, base_ts=base_ts)
        tmp = p.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for ln in lines:
                f.write(ln + b"\n")
        os.replace(tmp, p)
    return p


# Live events for the fan-out benchmark: another seed, dated after the stored ones
# (stored: 2026-08-29 .. 09-21; live: from 2026-10-16), so a `since` filter separates them.
LIVE_SEED = 2
LIVE_BASE_TS = BASE_TS + 4_000_000


def event_message(line: bytes) -> bytes:
    return b'["EVENT",' + line + b"]"


def verify(lines: list[bytes], sample: int, rng_seed: int = 0) -> int:
    """Check ids and signatures of a random sample; returns the number checked."""
    rng = random.Random(rng_seed)
    idx = rng.sample(range(len(lines)), min(sample, len(lines)))
    for i in idx:
        ev = orjson.loads(lines[i])
        eid = event_id(ev["pubkey"], ev["created_at"], ev["kind"], ev["tags"], ev["content"])
        assert eid == ev["id"], f"bad id at {i}"
        pub = PublicKeyXOnly(bytes.fromhex(ev["pubkey"]))
        assert pub.verify(bytes.fromhex(ev["sig"]), bytes.fromhex(eid)), f"bad sig at {i}"
    return len(idx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--authors", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--base-ts", type=int, default=BASE_TS)
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    ap.add_argument("--verify", type=int, default=200, help="verify a sample of this many")
    args = ap.parse_args()
    if args.force:
        p = generate(args.n, args.seed, args.authors, args.workers, base_ts=args.base_ts)
    else:
        p = _find_cached(args.n, args.seed, args.authors, args.base_ts) or generate(
            args.n, args.seed, args.authors, args.workers, base_ts=args.base_ts)
    lines = load(args.n, args.seed, args.authors, base_ts=args.base_ts)
    k = verify(lines, args.verify)
    kinds: dict[int, int] = {}
    for ln in lines:
        kk = orjson.loads(ln)["kind"]
        kinds[kk] = kinds.get(kk, 0) + 1
    print(f"{p}: {len(lines)} events, kinds {dict(sorted(kinds.items()))}, verified {k} sample(s)")


if __name__ == "__main__":
    main()
