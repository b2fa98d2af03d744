"""REQ latency: time from sending a REQ to receiving its EOSE, all events parsed by the client.

    .venv/bin/python bench/query.py --relay nostr-relay --n 100000      # start, load, query
    .venv/bin/python bench/query.py --relay localrelay --n 50000
    .venv/bin/python bench/query.py --url ws://127.0.0.1:7777 --n 100000  # already loaded
    .venv/bin/python bench/query.py --url ws://127.0.0.1:7777 --relay-pid PID --load --n 100000
                                     # any running relay (strfry...): publish the events first

Queries (each repeated --reps times on its own connection after 3 warm-ups):
  author_feed   {"authors":[A],"limit":500}              A = author with most events
  kind_since    {"kinds":[1],"since":T,"limit":500}       T = created_at 2,000 events from the end
  e_thread      {"#e":[R],"limit":500}                     R = most-replied root
  p_mentions    {"#p":[P],"limit":500}                     P = most-tagged pubkey
  one_id        {"ids":[x]}                                x random per repetition
  ids_100       {"ids":[100 random]}
  count_kind1   COUNT {"kinds":[1]}                        NIP-45, skipped if unanswered
  count_p       COUNT {"#p":[P]}
Every EVENT received is orjson-parsed in the receive callback; the clock stops when EOSE
(or COUNT) is parsed.  TCP_NODELAY is set, TCP_QUICKACK set and re-armed after every
receive.  Returned sets are compared with a model of the store (replaceable events
collapsed, newest first, limit applied): "match" says whether ids agree.
"""
from __future__ import annotations

import asyncio
import heapq
import json
import random
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import ingest  # noqa: E402
import stores  # noqa: E402
from wsraw import WSClient  # noqa: E402


# ------------------------------------------------------------------ store model
def is_replaceable(kind: int) -> bool:
    return kind in (0, 3) or 10000 <= kind < 20000


def replacement_key(e: dict) -> tuple | None:
    """NIP-01: (pubkey, kind) of a replaceable event, (pubkey, kind, d) of an addressable one, None otherwise."""
    kind = e["kind"]
    if is_replaceable(kind):
        return e["pubkey"], kind
    if 30000 <= kind < 40000:
        d = next((t[1] for t in e["tags"] if len(t) >= 2 and t[0] == "d"), "")
        return e["pubkey"], kind, d
    return None


def supersedes(e: dict, cur: dict) -> bool:
    """NIP-01: the newer version wins; at equal created_at, the lowest id."""
    return (e["created_at"], cur["id"]) > (cur["created_at"], e["id"])


def model_store(lines: list[bytes]) -> list[dict]:
    """The events a NIP-01 relay should hold after receiving `lines` (replaceable and addressable collapsed)."""
    evs = [orjson.loads(ln) for ln in lines]
    latest: dict[tuple, dict] = {}
    for e in evs:
        k = replacement_key(e)
        if k is not None and (k not in latest or supersedes(e, latest[k])):
            latest[k] = e
    keep = {id(v) for v in latest.values()}
    return [e for e in evs if replacement_key(e) is None or id(e) in keep]


def matches(f: dict, e: dict) -> bool:
    if "ids" in f and e["id"] not in f["ids"]:
        return False
    if "authors" in f and e["pubkey"] not in f["authors"]:
        return False
    if "kinds" in f and e["kind"] not in f["kinds"]:
        return False
    if "since" in f and e["created_at"] < f["since"]:
        return False
    if "until" in f and e["created_at"] > f["until"]:
        return False
    for k, vals in f.items():
        if k.startswith("#"):
            name = k[1:]
            if not any(len(t) >= 2 and t[0] == name and t[1] in vals for t in e["tags"]):
                return False
    return True


def expected(store: list[dict], f: dict) -> list[str]:
    m = [e for e in store if matches(f, e)]
    m.sort(key=lambda e: (-e["created_at"], e["id"]))
    if "limit" in f:
        m = m[:f["limit"]]
    return [e["id"] for e in m]


class TargetCounts:
    """What the targets are chosen by: events per author, and each `e` and `p` value's count in kind-1 events."""

    def __init__(self):
        self.by_author: dict[str, int] = {}
        self.e_refs: dict[str, int] = {}
        self.p_refs: dict[str, int] = {}

    def add(self, e: dict) -> None:
        self.by_author[e["pubkey"]] = self.by_author.get(e["pubkey"], 0) + 1
        if e["kind"] == 1:
            for t in e["tags"]:
                if len(t) >= 2 and t[0] == "e":
                    self.e_refs[t[1]] = self.e_refs.get(t[1], 0) + 1
                elif len(t) >= 2 and t[0] == "p":
                    self.p_refs[t[1]] = self.p_refs.get(t[1], 0) + 1


def pick_targets(store: list[dict], seed: int = 7, later: list[dict] = ()) -> dict:
    """Targets of the queries in `store`; the thread root is one that no event of `later` (published
    after the store is loaded) refers to, so that its thread query returns the same events throughout."""
    rng = random.Random(seed)
    grown = {t[1] for e in later for t in e["tags"] if len(t) >= 2 and t[0] == "e"}
    counts = TargetCounts()
    for e in store:
        counts.add(e)
    by_author, e_refs, p_refs = counts.by_author, counts.e_refs, counts.p_refs
    author = max(by_author, key=by_author.get)
    root = max((r for r in e_refs if r not in grown), key=e_refs.get)
    ptag = max(p_refs, key=p_refs.get)
    since = sorted(e["created_at"] for e in store)[-2000]
    regular_ids = [e["id"] for e in store if not is_replaceable(e["kind"])]
    return {"author": author, "author_events": by_author[author], "root": root,
            "root_refs": e_refs[root], "ptag": ptag, "ptag_refs": p_refs[ptag],
            "since": since, "ids": regular_ids, "rng": rng}


class StreamedModel:
    """model_store, pick_targets and expected for a JSONL file too large to hold (bench/scale.py), in two passes.

    Pass 1 counts what pick_targets counts (per author, per `e` and `p` value of kind-1 events), keeps the
    2,000 newest created_at, each replaceable or addressable key's winning (created_at, id), and a reservoir
    sample of `sample` regular ids.  Pass 2 collects the (created_at, id) of the stored events matching each
    fixed REQ filter of query_specs, and counts those of each COUNT.  Memory: the counters and the REQ matches,
    not the events.  The `ids` shapes are
    answered from the sample: regular events, and the mixes have no deletions, so each id asked is stored.
    """

    def __init__(self, open_lines: Callable[[], Iterable[bytes]], seed: int = 7, sample: int = 20_000):
        rng = random.Random(seed)
        counts = TargetCounts()
        newest: list[int] = []  # min-heap of the 2,000 newest created_at
        self.winners: dict[tuple, tuple[int, str]] = {}
        ids: list[str] = []
        seen_regular = 0
        self.kinds: dict[int, int] = {}
        for line in open_lines():
            e = orjson.loads(line)
            self.kinds[e["kind"]] = self.kinds.get(e["kind"], 0) + 1
            counts.add(e)
            (heapq.heappush if len(newest) < 2000 else heapq.heappushpop)(newest, e["created_at"])
            key = replacement_key(e)
            if key is not None:
                cur = self.winners.get(key)
                if cur is None or (e["created_at"], cur[1]) > (cur[0], e["id"]):  # supersedes()
                    self.winners[key] = (e["created_at"], e["id"])
                continue
            seen_regular += 1
            if len(ids) < sample:
                ids.append(e["id"])
            elif (j := rng.randrange(seen_regular)) < sample:
                ids[j] = e["id"]
        by_author, e_refs, p_refs = counts.by_author, counts.e_refs, counts.p_refs
        author = max(by_author, key=by_author.get)
        root = max(e_refs, key=e_refs.get)
        ptag = max(p_refs, key=p_refs.get)
        self.targets = {"author": author, "author_events": by_author[author], "root": root,
                        "root_refs": e_refs[root], "ptag": ptag, "ptag_refs": p_refs[ptag],
                        "since": newest[0], "ids": ids, "rng": rng}
        del counts, by_author, e_refs, p_refs
        fixed = {self._key(v, f): f for _, v, f in query_specs(self.targets) if not callable(f)}
        found: dict[bytes, list[tuple[int, str]]] = {k: [] for k in fixed if k.startswith(b"REQ")}
        self.counts: dict[bytes, int] = {k: 0 for k in fixed if k.startswith(b"COUNT")}
        for line in open_lines():
            e = orjson.loads(line)
            key = replacement_key(e)
            if key is not None and self.winners[key][1] != e["id"]:
                continue  # a superseded version
            for k, f in fixed.items():
                if matches(f, e):
                    if k in self.counts:
                        self.counts[k] += 1
                    else:
                        found[k].append((e["created_at"], e["id"]))
        self.answers: dict[bytes, list[str]] = {}
        for k, got in found.items():
            got.sort(key=lambda m: (-m[0], m[1]))
            self.answers[k] = [i for _, i in got[:fixed[k].get("limit", len(got))]]

    @staticmethod
    def _key(verb: str, flt: dict) -> bytes:
        return verb.encode() + orjson.dumps(flt, option=orjson.OPT_SORT_KEYS)

    def expect(self, verb: str, flt: dict) -> list[str] | int:
        """The ids a REQ of `flt` should return (any order), or the count a COUNT should answer."""
        if set(flt) == {"ids"}:
            ids = list(dict.fromkeys(flt["ids"]))
            return ids if verb == "REQ" else len(ids)
        return self.answers[self._key(verb, flt)] if verb == "REQ" else self.counts[self._key(verb, flt)]


def model_expect(store: list[dict]) -> Callable[[str, dict], list[str] | int]:
    """expect(verb, filter) of bench_queries from an in-memory model (model_store)."""
    return lambda verb, flt: expected(store, flt) if verb == "REQ" else len(expected(store, flt))


def query_specs(t: dict) -> list[tuple[str, str, object]]:
    """(name, verb, filter or callable(rng)->filter)."""
    ids = t["ids"]
    return [
        ("author_feed", "REQ", {"authors": [t["author"]], "limit": 500}),
        ("kind_since", "REQ", {"kinds": [1], "since": t["since"], "limit": 500}),
        ("e_thread", "REQ", {"#e": [t["root"]], "limit": 500}),
        ("p_mentions", "REQ", {"#p": [t["ptag"]], "limit": 500}),
        ("one_id", "REQ", lambda rng: {"ids": [rng.choice(ids)]}),
        ("ids_100", "REQ", lambda rng: {"ids": rng.sample(ids, 100)}),
        ("count_kind1", "COUNT", {"kinds": [1]}),
        ("count_p", "COUNT", {"#p": [t["ptag"]]}),
    ]


# ------------------------------------------------------------------ client
class Querier:
    def __init__(self):
        self.sub = None
        self.ids: list[str] = []
        self.fut: asyncio.Future | None = None
        self.t_done = 0.0
        self.count = None
        self.closed_reason = None
        self.notices: list[str] = []

    def on_msg(self, m: bytes) -> None:
        r = orjson.loads(m)  # every message, events included, is fully parsed
        typ = r[0]
        if typ == "EVENT":
            if r[1] == self.sub:
                self.ids.append(r[2]["id"])
        elif typ == "EOSE" or typ == "COUNT" or typ == "CLOSED":
            if r[1] == self.sub and self.fut and not self.fut.done():
                self.t_done = time.perf_counter()
                if typ == "COUNT":
                    self.count = r[2].get("count") if isinstance(r[2], dict) else r[2]
                if typ == "CLOSED":
                    self.closed_reason = str(r[2]) if len(r) > 2 else ""
                self.fut.set_result(typ)
        elif typ == "NOTICE":
            if len(self.notices) < 5:
                self.notices.append(str(r[1])[:200])

    async def run(self, ws: WSClient, verb: str, sub: str, flt: dict, timeout: float):
        self.sub = sub
        self.ids = []
        self.count = None
        self.closed_reason = None
        self.fut = asyncio.get_running_loop().create_future()
        msg = orjson.dumps([verb, sub, flt])
        t0 = time.perf_counter()
        ws.send(msg)
        try:
            typ = await asyncio.wait_for(self.fut, timeout)
        except asyncio.TimeoutError:
            return None, "timeout"
        lat = self.t_done - t0
        if verb == "REQ" and typ == "EOSE":
            ws.send(orjson.dumps(["CLOSE", sub]))
        return lat, typ


async def bench_queries(url: str, targets: dict, store: list[dict] | None, reps: int = 100,
                        warmup: int = 3, per_query_cap: float = 30.0,
                        only: list[str] | None = None, expect=None, seed: int = 11) -> list[dict]:
    """Each query of query_specs (or `only` those) on its own connection: `warmup` then `reps` repetitions
    (fewer past `per_query_cap` seconds); the first measured answer is checked against `expect(verb, filter)`
    (the ids, or the count; default: the model `store`; neither: no check).  `first_ms` is the first measured
    repetition's latency (after a page-cache eviction and no warm-up: the cold one)."""
    rng = random.Random(seed)
    if expect is None and store is not None:
        expect = model_expect(store)
    out = []
    for name, verb, f in query_specs(targets):
        if only and name not in only:
            continue
        q = Querier()
        ws = await WSClient.connect(url, q.on_msg, quickack=True)
        lats: list[float] = []
        res = {"query": name, "verb": verb, "reps": 0, "errors": {}, "returned": None,
               "expected": None, "match": None}
        t_start = time.perf_counter()
        for i in range(warmup + reps):
            flt = f(rng) if callable(f) else f
            lat, typ = await q.run(ws, verb, f"{name}-{i}", flt, 10.0 if i else 15.0)
            if lat is None or typ == "CLOSED":
                key = typ if lat is None else f"CLOSED: {q.closed_reason}"
                res["errors"][key] = res["errors"].get(key, 0) + 1
                if lat is None and ws.is_closed:
                    res["errors"]["connection closed"] = 1
                    break
                if verb == "COUNT" and lat is None:
                    res["unsupported"] = True  # no answer: the relay ignores COUNT
                    break
                continue
            if i == warmup and expect is not None:  # check one answer against the model
                exp = expect(verb, flt)
                if verb == "REQ":
                    res["returned"], res["expected"] = len(q.ids), len(exp)
                    res["match"] = sorted(q.ids) == sorted(exp)
                else:
                    res["returned"], res["expected"] = q.count, exp
                    res["match"] = q.count == exp
            if i >= warmup:
                lats.append(lat)
            if time.perf_counter() - t_start > per_query_cap and len(lats) >= 10:
                res["capped"] = True
                break
        await ws.close(1.0)
        if verb == "REQ":
            res["returned_last"] = len(q.ids)  # events in the last answer: what each rep's latency covers
        if lats:
            res["first_ms"] = lats[0] * 1e3
        lats.sort()
        res["reps"] = len(lats)
        if lats:
            res["p50_ms"] = common.percentile(lats, 0.5) * 1e3
            res["p99_ms"] = common.percentile(lats, 0.99) * 1e3
            res["mean_ms"] = sum(lats) / len(lats) * 1e3
        if q.notices:
            res["notices"] = q.notices
        out.append(res)
    return out


def fmt_row(r: dict) -> str:
    if not r["reps"]:
        return f"  {r['query']:<12} no result: {r['errors']}" + (" (unsupported)" if r.get("unsupported") else "")
    s = (f"  {r['query']:<12} p50 {r['p50_ms']:8.2f} ms  p99 {r['p99_ms']:8.2f} ms  "
         f"(n={r['reps']}) returned {r['returned']} expected {r['expected']}"
         f"{'' if r['match'] in (True, None) else '  MISMATCH'}")
    if r["errors"]:
        s += f"  errors {r['errors']}"
    return s


def main() -> None:
    ap, g = common.target_parser(__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--relay-pid", type=int, help="with --url: PID whose CPU (process tree) to account")
    ap.add_argument("--load", action="store_true",
                    help="with --url: first publish the --n events through the WebSocket (fresh relay)")
    ap.add_argument("--json")
    args = ap.parse_args()
    lines = events.load(args.n)
    store = model_store(lines)
    targets = pick_targets(store)
    common.eprint(f"targets: author with {targets['author_events']} events, root with "
                  f"{targets['root_refs']} refs, pubkey with {targets['ptag_refs']} mentions")
    srv = None
    try:
        if args.relay:
            srv, info = stores.start_loaded(args.relay, args.n)
            if "load" in info:
                common.eprint(f"loaded by publishing: {ingest.fmt(info['load'])}")
            url = srv.url
        else:
            url = args.url
            if args.load:
                common.eprint(f"loaded by publishing: {ingest.fmt(stores.publish_to(url, args.relay_pid, lines))}")
        pid = srv.pid if srv else args.relay_pid
        cpu0 = common.cpu_seconds(pid) if pid else None
        common.install_uvloop()
        res = asyncio.run(bench_queries(url, targets, store, args.reps, only=args.only))
        for r in res:
            print(fmt_row(r))
        if pid:
            print(f"relay CPU during the queries: {common.cpu_seconds(pid) - cpu0:.2f} s (process tree of {pid})")
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
    finally:
        if srv:
            srv.stop()


if __name__ == "__main__":
    main()
