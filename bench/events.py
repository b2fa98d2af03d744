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

The scale mix (`--mix scale`, `scale_file(n)`, for bench/scale.py): 20,000 authors by default, a
year of created_at (SCALE_BASE_TS, 2025-11-01, to 2026-11-01, whatever n), kinds 1 (threads,
mentions, hashtags), 7 (reactions), 6 (reposts carrying the reposted event's JSON, with `e` and
`p`), 3 (10-150 `p`), 0 and 30023 (long-form: `d`, `title`, `published_at`, `t`, a few KB of
content; a third revise the author's previous article).  Planned, signed and written in chunks:
no step holds the whole stream, so a million events take ~1 GB of disk and little memory.
`scale_live_file(n)`: plain kind-1 notes of 100 other authors dated after that year, for a
publisher running while the scale store is queried.
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
from bisect import bisect_right
from collections import deque
from pathlib import Path
from typing import Iterable, Iterator

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


def reply_tags(root: tuple, parent: tuple, pubkeys: list[str]) -> list[list[str]]:
    """NIP-10 tags of a reply to `parent` in the thread of `root` ((id, author index) each): the marked `e`
    tags, then `p` of their authors."""
    tags = [["e", root[0], "", "root"]]
    if parent is not root:
        tags.append(["e", parent[0], "", "reply"])
    tags.append(["p", pubkeys[root[1]]])
    if parent[1] != root[1]:
        tags.append(["p", pubkeys[parent[1]]])
    return tags


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
                tags = reply_tags(root, parent, pubkeys)
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


# ---------------------------------------------------------------- the scale mix, streamed
SCALE_FORMAT_VERSION = 1
SCALE_BASE_TS = 1761955200          # 2025-11-01T00:00:00Z
SCALE_SPAN = 365 * 86400            # the stored events span a year, whatever n
SCALE_LIVE_BASE_TS = SCALE_BASE_TS + SCALE_SPAN + 86400
SCALE_LIVE_AUTHORS = 100
SCALE_MIX = ((1, 0.62), (7, 0.22), (6, 0.06), (3, 0.04), (0, 0.03), (30023, 0.03))  # kind, share
SIGN_CHUNK = 2000                   # events per signing task


def _paragraphs(rng: random.Random, lo: int, hi: int) -> str:
    """Long-form text of about lo..hi bytes: paragraphs of words, markdown headings now and then."""
    target, parts, size = rng.randint(lo, hi), [], 0
    while size < target:
        p = _text(rng, 30, 90)
        if rng.random() < 0.15:
            p = "## " + p[:40] + "\n\n" + p
        parts.append(p)
        size += len(p) + 2
    return "\n\n".join(parts)


class _ScalePlanner:
    """The scale mix's state: recent notes, roots and thread tails, each author's last article, all bounded,
    so planning n events takes memory independent of n."""

    def __init__(self, seed: int, n_authors: int):
        self.rng = random.Random(seed)
        self.seed = seed
        self.pubkeys = [PublicKeyXOnly.from_secret(author_secret(seed, i)).format().hex() for i in range(n_authors)]
        acc, self.cum = 0.0, []
        for i in range(n_authors):
            acc += 1.0 / (i + 1) ** 0.8  # Zipf-like activity, mentions, reposts
            self.cum.append(acc)
        acc, self.kind_cum = 0.0, []
        for _, share in SCALE_MIX:
            acc += share
            self.kind_cum.append(acc)
        self.recent_notes: deque[dict] = deque(maxlen=5000)   # kind-1 events, for reactions and reposts
        self.roots: deque[tuple[str, int]] = deque(maxlen=2000)
        self.hot_roots: list[tuple[str, int]] = []            # the first 20 roots become long threads
        self.tails: dict[str, deque] = {}                      # root id -> its last 5 replies (id, author)
        self.articles: dict[int, tuple[str, int, str]] = {}    # author -> (d, published_at, title)
        self.keys: dict[int, PrivateKey] = {}

    def author(self) -> int:
        return self.rng.choices(range(len(self.pubkeys)), cum_weights=self.cum)[0]

    def signed(self, a: int, ev: dict) -> dict:
        """ev with its sig, the same as the signing pool makes (BIP-340 with zero aux randomness is deterministic)."""
        k = self.keys.get(a)
        if k is None:
            k = self.keys[a] = PrivateKey(author_secret(self.seed, a))
        return {**ev, "sig": k.sign_schnorr(bytes.fromhex(ev["id"]), b"\0" * 32).hex()}

    def note(self, a: int) -> tuple[list, str]:
        rng, pk = self.rng, self.pubkeys
        if self.roots and rng.random() < 0.45:  # a reply in a thread (NIP-10 markers)
            root = rng.choice(self.hot_roots) if rng.random() < 0.5 else rng.choice(self.roots)
            tail = self.tails.get(root[0])
            parent = rng.choice(tail) if tail and rng.random() < 0.6 else root
            return reply_tags(root, parent, pk), _text(rng, 3, 30)
        tags = [["p", pk[self.author()]] for _ in range(rng.randint(1, 3))] if rng.random() < 0.25 else []
        if rng.random() < 0.1:
            tags.append(["t", rng.choice(WORDS)])
        return tags, _text(rng, 5, 50)

    def article(self, a: int, created_at: int) -> tuple[list, str]:
        rng = self.rng
        prev = self.articles.get(a)
        if prev and rng.random() < 0.33:  # a revision: same d, new content
            d, published_at, title = prev
        else:
            title = _text(rng, 3, 8)
            d, published_at = "-".join(title.split()[:4]) + f"-{created_at}", created_at
        self.articles[a] = (d, published_at, title)
        tags = [["d", d], ["title", title], ["published_at", str(published_at)],
                ["summary", _text(rng, 8, 20)]]
        tags += [["t", w] for w in rng.sample(WORDS, rng.randint(1, 4))]
        return tags, _paragraphs(rng, 1000, 4000)

    def plan(self, i: int, created_at: int) -> tuple[int, dict]:
        rng, pk = self.rng, self.pubkeys
        a = self.author()
        kind = SCALE_MIX[bisect_right(self.kind_cum, rng.random() * self.kind_cum[-1])][0]
        if kind in (6, 7) and not self.recent_notes:
            kind = 1
        if kind == 1:
            tags, content = self.note(a)
        elif kind == 7:
            target = rng.choice(self.recent_notes)
            tags, content = [["e", target["id"]], ["p", target["pubkey"]], ["k", "1"]], rng.choice(REACTIONS)
        elif kind == 6:  # NIP-18: the reposted event's JSON as content
            target = rng.choice(self.recent_notes)
            tags = [["e", target["id"], ""], ["p", target["pubkey"]]]
            reposted = {k: v for k, v in target.items() if k != "_a"}
            content = orjson.dumps(self.signed(target["_a"], reposted)).decode()
        elif kind == 3:
            tags, content = [["p", pk[f]] for f in rng.sample(range(len(pk)), rng.randint(10, 150))], ""
        elif kind == 0:
            content = json.dumps({"name": f"user{a}", "about": _text(rng, 3, 15),
                                  "picture": f"https://example.invalid/{a}.png"}, ensure_ascii=False)
            tags = []
        else:
            tags, content = self.article(a, created_at)
        ev = {"id": event_id(pk[a], created_at, kind, tags, content), "pubkey": pk[a], "created_at": created_at,
              "kind": kind, "tags": tags, "content": content}
        if kind == 1:
            self.recent_notes.append({**ev, "_a": a})
            if tags and tags[0][0] == "e":
                self.tails.setdefault(tags[0][1], deque(maxlen=5)).append((ev["id"], a))
            else:
                if len(self.roots) == self.roots.maxlen:  # the oldest root leaves: forget its tail
                    old = self.roots[0]
                    if old not in self.hot_roots:
                        self.tails.pop(old[0], None)
                self.roots.append((ev["id"], a))
                if len(self.hot_roots) < 20:
                    self.hot_roots.append((ev["id"], a))
        return a, ev


def plan_scale(n: int, seed: int = 1, n_authors: int = 20_000) -> Iterator[tuple[int, dict]]:
    """Yield (author_index, event_dict_without_sig) for the n events of the scale mix, oldest first."""
    planner = _ScalePlanner(seed, n_authors)
    step = SCALE_SPAN / n
    for i in range(n):
        created_at = SCALE_BASE_TS + int(i * step) + planner.rng.randint(0, max(int(step) - 1, 0))
        yield planner.plan(i, created_at)


def plan_scale_live(n: int, seed: int = 1) -> Iterator[tuple[int, dict]]:
    """Yield plain kind-1 notes (no tags) of SCALE_LIVE_AUTHORS authors of their own, dated after the scale year."""
    rng = random.Random(seed)
    pubkeys = [PublicKeyXOnly.from_secret(author_secret(seed, i)).format().hex() for i in range(SCALE_LIVE_AUTHORS)]
    for i in range(n):
        a = rng.randrange(SCALE_LIVE_AUTHORS)
        created_at, content = SCALE_LIVE_BASE_TS + i // 100, _text(rng, 5, 50)
        yield a, {"id": event_id(pubkeys[a], created_at, 1, [], content), "pubkey": pubkeys[a],
                  "created_at": created_at, "kind": 1, "tags": [], "content": content}


def write_signed(path: Path, planned: Iterable[tuple[int, dict]], seed: int, n_authors: int,
                 workers: int | None = None) -> int:
    """Sign the planned events (authors' keys from `seed`) in a pool and write them to `path` as JSONL, in order,
    a chunk at a time (at most two chunks per worker in flight); the number written.  Atomic: a .tmp renamed."""
    workers = workers or os.cpu_count() or 1
    tmp, written = path.with_suffix(".tmp"), 0
    pending: deque = deque()

    def flush_one(f) -> int:
        chunk, result = pending.popleft()
        for (_, ev), sig in zip(chunk, result.get(timeout=600)):
            ev["sig"] = sig
            f.write(orjson.dumps(ev))
            f.write(b"\n")
        return len(chunk)

    with mp.get_context("fork").Pool(workers, _init_worker, (seed, n_authors)) as pool, open(tmp, "wb") as f:
        chunk: list[tuple[int, dict]] = []
        for item in planned:
            chunk.append(item)
            if len(chunk) == SIGN_CHUNK:
                pending.append((chunk, pool.apply_async(_sign_chunk, ([(a, ev["id"]) for a, ev in chunk],))))
                chunk = []
                if len(pending) >= 2 * workers:
                    written += flush_one(f)
        if chunk:
            pending.append((chunk, pool.apply_async(_sign_chunk, ([(a, ev["id"]) for a, ev in chunk],))))
        while pending:
            written += flush_one(f)
    os.replace(tmp, path)
    return written


def scale_path(n: int, seed: int = 1, n_authors: int = 20_000) -> Path:
    return RESULTS / f"events-scale-v{SCALE_FORMAT_VERSION}-s{seed}-a{n_authors}-n{n}.jsonl"


def scale_file(n: int, seed: int = 1, n_authors: int = 20_000, quiet: bool = False) -> Path:
    """The JSONL file of the n-event scale mix, generated (streamed) unless cached in bench/results/."""
    path = scale_path(n, seed, n_authors)
    if not path.exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        write_signed(path, plan_scale(n, seed, n_authors), seed, n_authors)
        if not quiet:
            print(f"generated {n:,} scale events in {time.perf_counter() - t0:.1f}s -> {path} "
                  f"({path.stat().st_size / 1e6:,.0f} MB)", file=sys.stderr)
    return path


def scale_live_file(n: int, seed: int = 1) -> Path:
    """The JSONL file of n plain kind-1 notes of plan_scale_live (their authors' keys: seed + 1000)."""
    path = RESULTS / f"events-scale-live-v{SCALE_FORMAT_VERSION}-s{seed}-n{n}.jsonl"
    if not path.exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        write_signed(path, plan_scale_live(n, seed + 1000), seed + 1000, SCALE_LIVE_AUTHORS)
    return path


def iter_lines(path: Path, n: int | None = None) -> Iterator[bytes]:
    """The first n lines (all without n) of a JSONL file, without their newline, read a line at a time."""
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if n is not None and i >= n:
                return
            yield line.rstrip(b"\n")


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


def _check_scale(path: Path, sample: int) -> str:
    """Kinds and bytes of a scale file, read a line at a time, and a random sample's ids and signatures verified."""
    rng, kinds, size, picked = random.Random(0), {}, 0, []
    for i, line in enumerate(iter_lines(path)):
        kind = orjson.loads(line)["kind"]
        kinds[kind] = kinds.get(kind, 0) + 1
        size += len(line) + 1
        if len(picked) < sample:
            picked.append(line)
        elif (j := rng.randrange(i + 1)) < sample:  # reservoir sampling
            picked[j] = line
    k = verify(picked, sample)
    return (f"{sum(kinds.values())} events, {size / 1e6:,.1f} MB, kinds {dict(sorted(kinds.items()))}, "
            f"verified {k} sample(s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--mix", choices=["bench", "scale"], default="bench",
                    help="bench: the benchmarks' mix (cached, prefix-stable); scale: bench/scale.py's, streamed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--authors", type=int, default=None, help="default 1,000 (bench) or 20,000 (scale)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--base-ts", type=int, default=BASE_TS)
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    ap.add_argument("--verify", type=int, default=200, help="verify a sample of this many")
    args = ap.parse_args()
    if args.mix == "scale":
        authors = args.authors or 20_000
        if args.force:
            scale_path(args.n, args.seed, authors).unlink(missing_ok=True)
        p = scale_file(args.n, args.seed, authors)
        print(f"{p}: {_check_scale(p, args.verify)}")
        return
    args.authors = args.authors or 1000
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
