"""Side by side with strfry: ours and a strfry the operator started, in one run, on the same events.

    .venv/bin/python bench/side_by_side.py --strfry-url ws://127.0.0.1:7777 --strfry-pid PID --workers 2
    .venv/bin/python bench/side_by_side.py --strfry-url ws://127.0.0.1:7777 --strfry-pid PID --workers 0 \\
        --n 5000 --fresh 5000 --reps 10 --idle-conns 200                         # smoke run

strfry must be fresh (an empty database) and listening on --strfry-url; --strfry-pid is its PID (its
threads are one process).  Ours is started here (`relay serve --workers N` on a fresh store, rate limits
off; stopped by its process group); its CPU and RSS are those of the whole process tree.  Each stage runs
on both relays before the next one starts:
0. memory: the fresh relay's RSS, and per 1,000 idle WebSockets (bench/idle_conns.py, --idle-conns open);
   first, because memory the later stages free stays in the heap and new connections would reuse it.
1. ingest: the first --n bench events (seed 1) published through the WebSocket (bench/ingest.py's generator,
   4 connections, 1,000 EVENTs in flight each): events/s OK true, relay CPU-seconds per 1,000 events.  Both
   relays then hold the same events.
2. REQ p50/p99: bench/query.py's suite (every answer of the first repetition checked against a model).
3. overload: bench/overload.py's loaded phase: one process publishes the next events at --load-rate
   events/s (default: half of strfry's ingest rate measured in stage 1), the same rate for both, while the
   REQs of stage 2 run again: their p50/p99.  Then the RSS of each, idle.
Prints a table with ours / strfry beside each figure and the goal it is held to; the results go to
bench/results/side_by_side-<stamp>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import idle_conns  # noqa: E402
import ingest  # noqa: E402
import overload  # noqa: E402
import query  # noqa: E402
import stores  # noqa: E402

RELAYS = ("strfry", "ours")


def log(*a) -> None:
    common.eprint(time.strftime("%H:%M:%S"), *a)


def attempt(what: str, fn) -> dict:
    """fn()'s result, or {"error": ...} (logged) so one failed stage does not end the run."""
    try:
        return fn()
    except Exception as e:
        log(f"{what}: FAILED {e!r}")
        return {"error": repr(e), "trace": traceback.format_exc()[-1500:]}


def run(targets_of: dict[str, tuple[str, int]], stored: list[bytes], fresh: list[bytes], args) -> dict:
    """The stages on each relay of `targets_of` (name -> (url, pid)); name -> stage -> result."""
    store = query.model_store(stored)
    # a thread the loaded phase's events do not extend: both phases' answers hold the same events
    targets = query.pick_targets(store, later=[orjson.loads(line) for line in fresh])
    res: dict = {name: {} for name in targets_of}
    # first, on the fresh relays: memory freed by the later stages stays in a process's heap and would be
    # reused by new connections, hiding their cost
    for name, (url, pid) in targets_of.items():
        res[name]["memory"] = m = attempt(f"{name} memory", lambda: idle_conns.idle_memory(url, pid, args.idle_conns))
        if "error" not in m:
            log(f"{name} memory: {idle_conns.fmt(m)}")
    for name, (url, pid) in targets_of.items():
        res[name]["ingest"] = r = attempt(f"{name} ingest", lambda: stores.publish_to(url, pid, stored))
        if "error" not in r:
            log(f"{name} ingest: {ingest.fmt(r)}")
    common.install_uvloop()
    for name, (url, pid) in targets_of.items():
        res[name]["queries"] = q = attempt(f"{name} queries",
                                           lambda: asyncio.run(query.bench_queries(url, targets, store, args.reps)))
        for row in q if isinstance(q, list) else []:
            log(f"{name}: {query.fmt_row(row).strip()}")
    strfry_eps = res["strfry"]["ingest"].get("eps", 0.0)
    rate = args.load_rate or strfry_eps / 2
    res["load_rate"] = rate
    for name, (url, pid) in targets_of.items():
        if rate <= 0:
            res[name]["overload"] = {"error": "no load rate: strfry's ingest failed and --load-rate is 0"}
            continue
        res[name]["overload"] = o = attempt(f"{name} overload",
                                            lambda: overload.loaded_phase(url, pid, targets, fresh, rate, args.reps))
        if "paced" in o:
            log(f"{name} loaded phase: publishing {o['paced']['rate']:,.0f} events/s, relay {o['relay_cores']:.2f} cores")
    for name, (url, pid) in targets_of.items():
        res[name]["rss_end"] = common.rss_detail(pid)
    return res


# ---------------------------------------------------------------- report
def _row(label: str, a, b, fmt: str, goal: str) -> str:
    def cell(v):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"
    ratio = f"{b / a:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
    return f"{label:<34}{cell(a):>12}{cell(b):>12}{ratio:>12}  {goal}"


def _per_1000(r: dict):
    return r["relay_cpu_s"] / r["acked"] * 1000 if r.get("acked") and r.get("relay_cpu_s") is not None else None


def report(res: dict, args) -> str:
    s, o = res["strfry"], res["ours"]
    L = [f"== Side by side: strfry vs ours (workers={args.workers}), the same {args.n:,} events, one run ==",
         f"{'':<34}{'strfry':>12}{'ours':>12}{'ours/strfry':>12}  goal"]
    L.append(_row("ingest, events/s OK true", s["ingest"].get("eps"), o["ingest"].get("eps"), ",.0f", ">= 1"))
    L.append(_row("  relay CPU-s per 1,000 events", _per_1000(s["ingest"]), _per_1000(o["ingest"]), ".3f", ""))
    qs = {name: {q["query"]: q for q in res[name]["queries"]} if isinstance(res[name]["queries"], list) else {}
          for name in RELAYS}
    L.append("REQ -> EOSE (COUNT) on the idle relay, ms:")
    for shape in qs["strfry"] or qs["ours"]:
        a, b = qs["strfry"].get(shape, {}), qs["ours"].get(shape, {})
        for pct in ("p50", "p99"):
            L.append(_row(f"  {shape} {pct}", a.get(f"{pct}_ms"), b.get(f"{pct}_ms"), ".2f", ""))
        for name, q in (("strfry", a), ("ours", b)):
            if q.get("match") is False or q.get("errors"):
                L.append(f"    {name}: returned {q.get('returned')} expected {q.get('expected')} errors {q.get('errors')}"
                         f"{' (unsupported)' if q.get('unsupported') else ''}")
    ls, lo = s["overload"], o["overload"]
    L.append(f"REQ -> EOSE while one publisher sends {res['load_rate']:,.0f} events/s, ms:")
    for name, x in (("strfry", ls), ("ours", lo)):
        L.append(overload.fmt_phase(name, x))
    for shape in overload.REQ_QUERIES:
        a, b = ls.get("loaded", {}).get(shape, {}), lo.get("loaded", {}).get(shape, {})
        L.append(_row(f"  {shape} p50", a.get("p50_ms"), b.get("p50_ms"), ".2f", ""))
        L.append(_row(f"  {shape} p99", a.get("p99_ms"), b.get("p99_ms"), ".2f", "<= 1"))
    ms, mo = s["memory"], o["memory"]
    L.append(_row("RSS of the process tree, fresh, MB", ms.get("rss_idle_mb"), mo.get("rss_idle_mb"), ".1f", ""))
    L.append(_row("  RssAnon fresh, MB", ms.get("rssanon_idle_mb"), mo.get("rssanon_idle_mb"), ".1f", ""))
    L.append(_row("RSS idle after the run, MB", s["rss_end"]["vmrss_mb"], o["rss_end"]["vmrss_mb"], ".1f", ""))
    L.append(_row("  RssAnon idle after the run, MB", s["rss_end"]["rssanon_mb"], o["rss_end"]["rssanon_mb"], ".1f", ""))
    L.append(_row("RSS per 1,000 idle connections, MB", ms.get("mb_per_1000"), mo.get("mb_per_1000"), ".1f",
                  "ours <= today's (20 KB/conn)"))
    L.append(_row("  RssAnon per 1,000, MB", ms.get("anon_mb_per_1000"), mo.get("anon_mb_per_1000"), ".1f", ""))
    for name, m in (("strfry", ms), ("ours", mo)):
        if "error" in m:
            L.append(f"    {name}: {m['error']}")
        elif m["failed"]:
            L.append(f"    {name}: {m['failed']:,} of {m['conns']:,} connections refused")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strfry-url", required=True, help="a fresh strfry listening there (empty database)")
    ap.add_argument("--strfry-pid", type=int, required=True, help="strfry's PID")
    ap.add_argument("--workers", type=int, default=None,
                    help="ours: `relay serve --workers N` (default: the relay's own default)")
    ap.add_argument("--n", type=int, default=100_000, help="events both relays ingest and are queried on")
    ap.add_argument("--fresh", type=int, default=200_000,
                    help="further events available to the loaded phase (it stops if they run out)")
    ap.add_argument("--reps", type=int, default=100, help="repetitions of each query per phase")
    ap.add_argument("--load-rate", type=float, default=0.0,
                    help="events/s of the loaded phase (default 0: half of strfry's ingest rate in this run)")
    ap.add_argument("--idle-conns", type=int, default=2000, help="idle WebSockets opened for the memory figure")
    args = ap.parse_args()
    lines = events.load(args.n + args.fresh)
    ours = common.ours(workers=args.workers).start()
    try:
        log(f"ours: {ours.url}, pid {ours.pid}, processes {len(common.tree_pids(ours.pid))}; strfry: "
            f"{args.strfry_url}, pid {args.strfry_pid}")
        res = run({"strfry": (args.strfry_url, args.strfry_pid), "ours": (ours.url, ours.pid)},
                  lines[:args.n], lines[args.n:], args)
    finally:
        ours.stop()
    text = report(res, args)
    print(text)
    common.RESULTS.mkdir(exist_ok=True)
    out = common.RESULTS / f"side_by_side-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "results": res, "table": text}, indent=1, default=str))
    print(f"({out})")


if __name__ == "__main__":
    main()
