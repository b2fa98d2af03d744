"""Fan-out: 1,000 live subscriptions on 100 connections, one publisher, deliveries per second.

    .venv/bin/python bench/fanout.py --relay localrelay [--duration 10]
    .venv/bin/python bench/fanout.py --url ws://127.0.0.1:7777 --relay-pid 1234

Subscribers: 100 connections in 2 processes, 10 REQs each (1,000 subscriptions), all with
since = start of the live stream (seed 2, dated after every stored event, so nothing stored
matches and only live events are delivered):
  per connection: 1 follow feed of 50 busy authors {"kinds":[1,7],"authors":[...]},
  4 follow feeds of 50 random authors, 3 mention subs {"kinds":[1,7],"#p":[one of the
  100 most-tagged]}, 2 thread subs {"kinds":[1],"#e":[one of the 50 biggest live threads]},
  and on every 10th connection a kind-1 firehose (10 in all) instead of one random feed.
Publisher: one connection (one process) publishing live events pipelined (--window,
default 100 unacknowledged) for --duration seconds.
Counted: EVENT frames received by subscribers (counted in the frame parser, not parsed),
until no more arrive for 2 s.  Reported: deliveries/s = deliveries / (last delivery -
first publish), publish rate, deliveries expected from the filters for the events the relay
accepted (so dropped deliveries show), relay CPU, relay VmRSS (idle with subscriptions,
peak during the run, sampled every 0.25 s).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import ingest  # noqa: E402
from query import matches  # noqa: E402
from wsraw import WSClient, WSClosed  # noqa: E402

LIVE_N = 30_000


def build_filters(live: list[dict], conns: int, per_conn: int, seed: int = 5) -> list[list[dict]]:
    rng = random.Random(seed)
    since = events.LIVE_BASE_TS
    counts: dict[str, int] = {}
    ptags: dict[str, int] = {}
    roots: dict[str, int] = {}
    for e in live:
        counts[e["pubkey"]] = counts.get(e["pubkey"], 0) + 1
        for t in e["tags"]:
            if t[0] == "p":
                ptags[t[1]] = ptags.get(t[1], 0) + 1
            elif t[0] == "e" and len(t) > 3 and t[3] == "root":
                roots[t[1]] = roots.get(t[1], 0) + 1
    authors = sorted(counts, key=counts.get, reverse=True)
    busy = authors[:200]
    top_p = sorted(ptags, key=ptags.get, reverse=True)[:100]
    top_roots = sorted(roots, key=roots.get, reverse=True)[:50]
    out = []
    for c in range(conns):
        fl = [{"kinds": [1, 7], "authors": rng.sample(busy, 50), "since": since}]
        for _ in range(4):
            fl.append({"kinds": [1, 7], "authors": rng.sample(authors, 50), "since": since})
        for _ in range(3):
            fl.append({"kinds": [1, 7], "#p": [rng.choice(top_p)], "since": since})
        for _ in range(2):
            fl.append({"kinds": [1], "#e": [rng.choice(top_roots)], "since": since})
        if c % 10 == 0:
            fl[1] = {"kinds": [1], "since": since}  # firehose
        out.append(fl[:per_conn])
    return out


def fanout_counts(flat: list[dict], live: list[dict]) -> list[int]:
    """For each live event, how many of the filters match it (inverted index + check)."""
    index: dict[tuple, list[int]] = {}
    for i, f in enumerate(flat):
        if "authors" in f:
            keys = [("a", a) for a in f["authors"]]
        elif "#p" in f:
            keys = [("p", v) for v in f["#p"]]
        elif "#e" in f:
            keys = [("e", v) for v in f["#e"]]
        else:
            keys = [("*",)]
        for k in keys:
            index.setdefault(k, []).append(i)
    out = []
    for e in live:
        cand = set(index.get(("*",), ()))
        cand.update(index.get(("a", e["pubkey"]), ()))
        for t in e["tags"]:
            if len(t) >= 2 and t[0] in ("p", "e"):
                cand.update(index.get((t[0], t[1]), ()))
        out.append(sum(1 for i in cand if matches(flat[i], e)))
    return out


# ------------------------------------------------------------------ subscriber process
async def _subs_main(idx, url, filters, ready_q, go_evt, stop_evt, counter, last_t):
    clients = []
    errors = []
    eose = 0
    closed = []

    def make_cb(ci):
        def cb(m: bytes):
            nonlocal eose
            r = orjson.loads(m)
            if r[0] == "EOSE":
                eose += 1
            elif r[0] in ("CLOSED", "NOTICE"):
                if len(closed) < 5:
                    closed.append(m[:200].decode(errors="replace"))
        return cb

    for ci, fl in enumerate(filters):
        try:
            ws = await WSClient.connect(url, make_cb(ci), quickack=False,
                                        count_prefix=b'["EVENT"')
        except Exception as e:
            errors.append(f"connect {ci}: {e!r}")
            continue
        clients.append(ws)
        for j, f in enumerate(fl):
            ws.send(orjson.dumps(["REQ", f"c{idx}-{ci}-{j}", f]))
    nsubs = sum(len(fl) for fl in filters)
    t_end = time.time() + 120  # nostr-relay answers 1,000 REQs on a 100k store slowly
    while eose < nsubs and time.time() < t_end:
        await asyncio.sleep(0.05)
    pre = sum(c.prefix_count for c in clients)
    ready_q.put({"idx": idx, "conns": len(clients), "eose": eose, "subs": nsubs,
                 "stored_events_received": pre, "errors": errors, "closed": list(closed)})
    cpu0 = common.self_cpu()
    while not stop_evt.is_set():
        counter.value = sum(c.prefix_count for c in clients) - pre
        last_t.value = max((c.last_count_t for c in clients), default=0.0)
        await asyncio.sleep(0.1)
    counter.value = sum(c.prefix_count for c in clients) - pre
    last_t.value = max((c.last_count_t for c in clients), default=0.0)
    cpu = common.self_cpu() - cpu0
    dead = sum(1 for c in clients if c.is_closed)
    for c in clients:
        await c.close(0.2)
    return {"idx": idx, "cpu": cpu, "dead_conns": dead, "closed": list(closed)}


def _subs_proc(idx, url, filters, ready_q, done_q, go_evt, stop_evt, counter, last_t):
    common.install_uvloop()
    try:
        r = asyncio.run(_subs_main(idx, url, filters, ready_q, go_evt, stop_evt, counter, last_t))
    except Exception as e:
        r = {"idx": idx, "error": repr(e), "cpu": 0.0}
        ready_q.put({"idx": idx, "conns": 0, "eose": 0, "subs": 0, "errors": [repr(e)],
                     "closed": [], "stored_events_received": 0})
    done_q.put(r)


# ------------------------------------------------------------------ publisher process
_LIVE_LINES: list[bytes] = []


async def _pub_main(url, go_evt, duration, window, reconnect_every):
    msgs = [events.event_message(ln) for ln in _LIVE_LINES]
    st = {"sent": 0, "acked": 0, "ok_false_idx": [], "reasons": {}, "error": None}
    idx_of = {}
    wake = asyncio.Event()

    def on_msg(m: bytes, conn):
        if m.startswith(b'["OK"'):
            r = orjson.loads(m)
            st["acked"] += 1
            conn["acked"] += 1
            if r[2] is not True:
                st["ok_false_idx"].append(idx_of.get(r[1], -1))
                k = str(r[3])[:100]
                st["reasons"][k] = st["reasons"].get(k, 0) + 1
            wake.set()

    for i, ln in enumerate(_LIVE_LINES):
        idx_of[ln[7:71].decode()] = i  # '{"id":"<64 hex>"' as written by events.py

    async def connect():
        conn = {"sent": 0, "acked": 0}
        return await WSClient.connect(url, lambda m: on_msg(m, conn), quickack=False), conn

    ws, conn = await connect()
    old = []
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, go_evt.wait)
    cpu0 = common.self_cpu()
    t0 = time.perf_counter()
    st["t0"] = t0
    try:
        while st["sent"] < len(msgs) and time.perf_counter() - t0 < duration:
            room = window - (st["sent"] - st["acked"])
            if room <= 0:
                wake.clear()
                if ws.is_closed:
                    raise WSClosed("publisher connection closed")
                try:
                    await asyncio.wait_for(wake.wait(), 0.2)
                except asyncio.TimeoutError:
                    pass
                continue
            if reconnect_every and conn["sent"] >= reconnect_every:
                old.append((ws, conn))
                ws, conn = await connect()
            k = min(room, 50, len(msgs) - st["sent"])
            if reconnect_every:
                k = min(k, reconnect_every - conn["sent"])
            ws.send_many(msgs[st["sent"]:st["sent"] + k])
            st["sent"] += k
            conn["sent"] += k
            await ws.drain()
            while old and old[0][1]["acked"] >= old[0][1]["sent"]:
                await old.pop(0)[0].close(0.5)
        st["t_stop"] = time.perf_counter()
        end = time.perf_counter() + 30
        while st["acked"] < st["sent"] and time.perf_counter() < end and not ws.is_closed:
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
    except (WSClosed, ConnectionError) as e:
        st["error"] = repr(e)
    st["t_last_ok"] = time.perf_counter()
    st["cpu"] = common.self_cpu() - cpu0
    for w, _ in old:
        await w.close(0.5)
    await ws.close(0.5)
    return st


def _pub_proc(url, go_evt, q, duration, window, reconnect_every):
    common.install_uvloop()
    try:
        r = asyncio.run(_pub_main(url, go_evt, duration, window, reconnect_every))
    except Exception as e:
        r = {"error": repr(e), "sent": 0, "acked": 0, "ok_false_idx": [], "cpu": 0.0,
             "reasons": {}}
    q.put(r)


# ------------------------------------------------------------------ orchestration
def run_fanout(url: str, relay_pid: int | None, duration: float = 10.0, conns: int = 100,
               per_conn: int = 10, sub_procs: int = 2, window: int = 100,
               reconnect_every: int = 0, log=common.eprint) -> dict:
    global _LIVE_LINES
    _LIVE_LINES = events.load(LIVE_N, seed=events.LIVE_SEED, base_ts=events.LIVE_BASE_TS)
    live = [orjson.loads(ln) for ln in _LIVE_LINES]
    filters = build_filters(live, conns, per_conn)
    flat = [f for fl in filters for f in fl]
    ctx = mp.get_context("fork")
    ready_q, done_q, pub_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    go_evt, stop_evt = ctx.Event(), ctx.Event()
    counters = [ctx.Value("q", 0, lock=False) for _ in range(sub_procs)]
    lasts = [ctx.Value("d", 0.0, lock=False) for _ in range(sub_procs)]
    procs = []
    per = (conns + sub_procs - 1) // sub_procs
    for i in range(sub_procs):
        p = ctx.Process(target=_subs_proc, args=(i, url, filters[i * per:(i + 1) * per], ready_q,
                                                 done_q, go_evt, stop_evt, counters[i], lasts[i]),
                        daemon=True)
        p.start()
        procs.append(p)
    pub = ctx.Process(target=_pub_proc, args=(url, go_evt, pub_q, duration, window,
                                              reconnect_every), daemon=True)
    pub.start()
    ready = []
    t_setup = time.perf_counter()
    for _ in range(sub_procs):
        ready.append(ready_q.get(timeout=180))
    res: dict = {"conns_open": sum(r["conns"] for r in ready),
                 "subs_eose": sum(r["eose"] for r in ready),
                 "subs": sum(r["subs"] for r in ready),
                 "stored_events_on_subscribe": sum(r["stored_events_received"] for r in ready),
                 "setup_errors": [e for r in ready for e in r["errors"]][:5],
                 "setup_closed": [e for r in ready for e in r["closed"]][:5],
                 "setup_s": time.perf_counter() - t_setup}
    time.sleep(0.5)
    if relay_pid:
        d = common.rss_detail(relay_pid)
        res["rss_idle_mb"], res["rssanon_idle_mb"] = d["vmrss_mb"], d["rssanon_mb"]
    else:
        res["rss_idle_mb"] = res["rssanon_idle_mb"] = None
    peak = [res["rss_idle_mb"] or 0.0, res["rssanon_idle_mb"] or 0.0]
    stop_sampler = threading.Event()

    def sampler():
        while not stop_sampler.wait(0.25):
            if relay_pid:
                d = common.rss_detail(relay_pid)
                peak[0] = max(peak[0], d["vmrss_mb"])
                peak[1] = max(peak[1], d["rssanon_mb"])

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    rcpu0 = common.cpu_seconds(relay_pid) if relay_pid else None
    sys0 = common.system_busy()
    t_go = time.perf_counter()
    go_evt.set()
    pub_res = pub_q.get(timeout=duration + 120)
    # wait for deliveries to stop growing
    last_total, last_change = -1, time.perf_counter()
    hard_end = time.perf_counter() + 30
    while time.perf_counter() < hard_end:
        tot = sum(c.value for c in counters)
        if tot != last_total:
            last_total, last_change = tot, time.perf_counter()
        elif time.perf_counter() - last_change > 2.0:
            break
        time.sleep(0.1)
    rcpu1 = common.cpu_seconds(relay_pid) if relay_pid else None
    sys_busy = common.system_busy() - sys0
    t_meas = time.perf_counter() - t_go
    stop_evt.set()
    done = [done_q.get(timeout=30) for _ in range(sub_procs)]
    stop_sampler.set()
    th.join()
    for p in procs + [pub]:
        p.join(5)
        if p.is_alive():
            p.kill()
    delivered = sum(c.value for c in counters)
    t_last = max(v.value for v in lasts)
    span = (t_last - pub_res["t0"]) if pub_res.get("t0") and t_last else float("nan")
    bad = set(pub_res["ok_false_idx"])
    fan = fanout_counts(flat, live[:pub_res["sent"]])
    expected = sum(x for i, x in enumerate(fan) if i not in bad)
    pub_span = pub_res.get("t_last_ok", 0) - pub_res.get("t0", 0)
    res.update({
        "published_sent": pub_res["sent"], "published_ok": pub_res["acked"] - len(bad),
        "publish_eps": (pub_res["acked"] - len(bad)) / pub_span if pub_span > 0 else 0.0,
        "delivered": delivered, "expected": expected,
        "delivered_ratio": delivered / expected if expected else None,
        "seconds": span, "deliveries_per_s": delivered / span if span and span > 0 else 0.0,
        "mean_fanout": sum(fan) / len(fan) if fan else 0.0,
        "relay_cpu_s": (rcpu1 - rcpu0) if relay_pid else None,
        "rss_peak_mb": peak[0] if relay_pid else None,
        "rssanon_peak_mb": peak[1] if relay_pid else None,
        "gen_cpu_s": pub_res.get("cpu", 0.0) + sum(d.get("cpu", 0.0) for d in done),
        "dead_sub_conns": sum(d.get("dead_conns", 0) for d in done),
        "pub_error": pub_res.get("error"), "pub_reasons": pub_res.get("reasons", {}),
        "sub_closed": [c for d in done for c in d.get("closed", [])][:5],
        "wall_s": time.perf_counter() - t_go,
    })
    res["relay_cores"] = res["relay_cpu_s"] / span if relay_pid and span and span > 0 else None
    res["other_cores"] = max(0.0, sys_busy - res["gen_cpu_s"] - (res["relay_cpu_s"] or 0)) / t_meas
    return res


def fmt(r: dict) -> str:
    s = (f"{r['subs_eose']}/{r['subs']} subs on {r['conns_open']} conns; published "
         f"{r['published_ok']:,} ok ({r['publish_eps']:,.0f}/s); delivered {r['delivered']:,} of "
         f"{r['expected']:,} expected ({(r['delivered_ratio'] or 0) * 100:.1f}%) in "
         f"{r['seconds']:.2f}s = {r['deliveries_per_s']:,.0f} deliveries/s "
         f"(mean fan-out {r['mean_fanout']:.1f}); gen CPU {r['gen_cpu_s']:.1f}s")
    if r["relay_cpu_s"] is not None:
        s += (f"; relay CPU {r['relay_cpu_s']:.1f}s ({r['relay_cores']:.2f} cores), VmRSS idle "
              f"{r['rss_idle_mb']:.0f} MB, peak {r['rss_peak_mb']:.0f} MB (RssAnon "
              f"{r['rssanon_idle_mb']:.0f} / {r['rssanon_peak_mb']:.0f} MB)")
    s += f"; subscribe took {r['setup_s']:.1f}s; other load {r['other_cores']:.2f} cores"
    for k in ("setup_errors", "setup_closed", "sub_closed"):
        if r.get(k):
            s += f"\n    {k}: {r[k]}"
    if r.get("pub_error"):
        s += f"\n    publisher: {r['pub_error']}"
    if r.get("pub_reasons"):
        s += f"\n    OK-false: {r['pub_reasons']}"
    if r.get("dead_sub_conns"):
        s += f"\n    subscriber connections closed by relay: {r['dead_sub_conns']}"
    if r.get("stored_events_on_subscribe"):
        s += f"\n    stored events received on subscribe: {r['stored_events_on_subscribe']}"
    return s


def main() -> None:
    ap, g = common.target_parser(__doc__)
    ap.add_argument("--relay-pid", type=int)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    srv = None
    try:
        if args.relay:
            srv = common.FACTORIES[args.relay]().start()
        url = srv.url if srv else args.url
        pid = srv.pid if srv else args.relay_pid
        rec = ingest.RECONNECT_EVERY.get(args.relay or "", 0)
        r = run_fanout(url, pid, args.duration, window=args.window, reconnect_every=rec)
        print(fmt(r))
        if args.json:
            Path(args.json).write_text(json.dumps(r, indent=1))
    finally:
        if srv:
            srv.stop()


if __name__ == "__main__":
    main()
