"""REQ latency under load: well-behaved clients' REQ p99 with publishers at half the ingest capacity,
against the same REQs on the idle relay; prints the ratio (target: within 3x).

    .venv/bin/python bench/overload.py                               # ~3 min on a quiet machine
    .venv/bin/python bench/overload.py --n 5000 --capacity-seconds 3 --reps 10 --fresh 20000   # smoke run
    .venv/bin/python bench/overload.py --url ws://127.0.0.1:7777 --relay-pid PID --load-rate 5000 \
        --capacity-seconds 0                       # any running relay (strfry...), at a fixed load

One relay (ours, or --relay nostr-relay for the reference; loaded with the first --n bench events as
stores.py does; or --url: a relay already running, loaded by publishing them unless --preloaded says
it holds them), then:
1. unloaded: the REQs of query.py (author feed, kind since, thread, mentions, one id, 100 ids; each
   --reps times on its own connection, every event parsed), p50/p99 of REQ -> EOSE;
2. capacity: ingest.run_ingest of new events (the next ones of the same seed), --conns connections at
   full speed for --capacity-seconds: events/s acknowledged with OK true (0: skipped, --load-rate given);
3. loaded: one process publishes new events paced at half that rate (or --load-rate events/s; a send
   every 10 ms), while the same REQs run again; p50/p99, the publish rate reached, and p99 loaded /
   p99 unloaded per query. Also printed: the cores busy, and how much of the phase the relay's event-loop
   thread spent on a CPU and runnable but waiting for one (the kernel's schedstat; not with --url, whose
   serving threads are unknown): on a small machine shared with the benchmark's own processes, that wait
   shows up in the tail.
Like for like: the new events leave every answer's size as it was (the thread queried is one they do
not extend; the other REQs are full at their limit of 500 or ask for fixed ids); the events in each
phase's last answer are printed beside the ratio.
Loopback only; the relay is started and stopped by its own PID (common.Server).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import ingest  # noqa: E402
import query  # noqa: E402
import stores  # noqa: E402
from wsraw import WSClient  # noqa: E402

TARGET_RATIO = 3.0
TICK_SECONDS = 0.01  # the paced publisher sends what is due every tick
MAX_UNANSWERED = 20_000  # the paced publisher stops sending past this many EVENTs without their OK
REQ_QUERIES = ["author_feed", "kind_since", "e_thread", "p_mentions", "one_id", "ids_100"]


async def _paced(url: str, lines: list[bytes], rate: float, stop, out) -> None:
    """Send `lines` as EVENTs at `rate` per second until `stop` is set or they run out; report to `out`."""
    oks = [0, 0]  # true, false

    def on_msg(m: bytes) -> None:
        if m.startswith(b'["OK"'):
            oks[0 if b",true," in m[:90] else 1] += 1

    ws = await WSClient.connect(url, on_msg, quickack=False)
    t0, sent = time.perf_counter(), 0
    while not stop.is_set() and sent < len(lines):
        due = min(len(lines), int((time.perf_counter() - t0) * rate))
        if due > sent and sent - sum(oks) < MAX_UNANSWERED:
            ws.send_many([events.event_message(line) for line in lines[sent:due]])
            sent = due
            await ws.drain()
        await asyncio.sleep(TICK_SECONDS)
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(1.0)  # the last OKs
    out.put({"sent": sent, "ok_true": oks[0], "ok_false": oks[1], "seconds": elapsed,
             "rate": sent / elapsed if elapsed else 0.0, "ran_out": sent >= len(lines)})
    await ws.close(1.0)


def _paced_process(url, lines, rate, stop, out) -> None:
    common.install_uvloop()
    asyncio.run(_paced(url, lines, rate, stop, out))


def latencies(url: str, targets: dict, store: list[dict] | None, reps: int) -> dict[str, dict]:
    """query.bench_queries over the REQ queries: name -> its result (p50_ms, p99_ms, ...)."""
    return {r["query"]: r for r in asyncio.run(query.bench_queries(url, targets, store, reps, only=REQ_QUERIES))}


def loaded_phase(url: str, relay_pid: int | None, targets: dict, lines: list[bytes], rate: float,
                 reps: int) -> dict:
    """The REQs of `latencies` (`reps` each) while one process publishes `lines` at `rate` events/s.

    Returns {"loaded": name -> result, "paced": the publisher's report (sent, ok_true, ok_false, seconds,
    rate, ran_out), "relay_cores": CPU of relay_pid's process tree per second, "busy_cores": all cores busy
    per second, "wall": seconds}; relay_cores is None without relay_pid."""
    ctx = mp.get_context("fork")
    stop, out = ctx.Event(), ctx.Queue()
    publisher = ctx.Process(target=_paced_process, args=(url, lines, rate, stop, out), daemon=True)
    cpu0 = common.cpu_seconds(relay_pid) if relay_pid else None
    busy0, t0 = common.system_busy(), time.perf_counter()
    publisher.start()
    try:
        time.sleep(1.0)  # the publisher reaches its pace
        loaded = latencies(url, targets, None, reps)
    finally:
        stop.set()
        paced = out.get(timeout=60)
        publisher.join(10)
    wall = time.perf_counter() - t0
    relay_cores = (common.cpu_seconds(relay_pid) - cpu0) / wall if relay_pid else None
    return {"loaded": loaded, "paced": paced, "relay_cores": relay_cores,
            "busy_cores": (common.system_busy() - busy0) / wall, "wall": wall}


def fmt_phase(name: str, phase: dict) -> str:
    """One line on a loaded_phase result: the rate the publisher reached, its OKs, the cores busy."""
    if "paced" not in phase:
        return f"    {name}: {phase.get('error')}"
    p = phase["paced"]
    return (f"    {name}: publisher reached {p['rate']:,.0f} events/s ({p['ok_true']:,} OK true, "
            f"{p['ok_false']:,} OK false{', RAN OUT of events' if p['ran_out'] else ''}), relay "
            f"{phase['relay_cores']:.2f} cores, all processes {phase['busy_cores']:.2f} cores")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="events stored before measuring (default 20,000)")
    ap.add_argument("--fresh", type=int, default=300_000,
                    help="new events: the first half for the capacity phase, the rest for the loaded one"
                         " (default 300,000)")
    ap.add_argument("--conns", type=int, default=4, help="connections measuring ingest capacity (default 4)")
    ap.add_argument("--capacity-seconds", type=float, default=10.0,
                    help="length of the capacity phase (0: skip it; needs --load-rate)")
    ap.add_argument("--reps", type=int, default=100, help="repetitions of each REQ per phase (default 100)")
    ap.add_argument("--load-rate", type=float, default=0.0,
                    help="events/s published in the loaded phase (default 0: half the measured capacity, the"
                         " target's load); a fixed rate compares relays at the same load")
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--relay", choices=["ours", "nostr-relay"], default="ours",
                        help="the relay measured, started here (default ours; nostr-relay: the PyPI reference,"
                             " stores.py)")
    target.add_argument("--url", help="measure the relay already running there instead (any implementation)")
    ap.add_argument("--relay-pid", type=int, help="with --url: the PID whose CPU (process tree) to account")
    ap.add_argument("--preloaded", action="store_true",
                    help="with --url: the relay already holds the first --n events (else they are published)")
    args = ap.parse_args()
    if args.url and not args.relay_pid:
        ap.error("--url needs --relay-pid")
    if args.capacity_seconds <= 0 and not args.load_rate:
        ap.error("--capacity-seconds 0 needs --load-rate")

    lines = events.load(args.n + args.fresh)
    stored, fresh = lines[:args.n], lines[args.n:]
    # run_ingest sends the head of each connection's shard: keep the loaded phase's events apart
    for_capacity, for_load = fresh[:len(fresh) // 2], fresh[len(fresh) // 2:]
    store = query.model_store(stored)
    # a thread that the new events do not extend: loaded and unloaded answers hold the same events
    targets = query.pick_targets(store, later=[orjson.loads(line) for line in fresh])
    srv, loop_pid = None, None
    if args.url:
        url, relay_pid = args.url, args.relay_pid
        if not args.preloaded:
            print(f"loaded by publishing: {ingest.fmt(stores.publish_to(url, relay_pid, stored))}", flush=True)
    else:
        srv, _ = stores.start_loaded(args.relay, args.n)
        url, relay_pid = srv.url, srv.pid
        loop_pid = common.tree_pids(srv.pid)[-1]  # the process serving WebSockets (nostr-relay: gunicorn's worker)
    try:
        common.install_uvloop()
        idle_loop0, idle_t0 = common.thread_schedstat(loop_pid), time.perf_counter()
        idle = latencies(url, targets, store, args.reps)
        idle_wait = (common.thread_schedstat(loop_pid)[1] - idle_loop0[1]) / (time.perf_counter() - idle_t0)
        rate = args.load_rate
        if args.capacity_seconds > 0:
            capacity = ingest.run_ingest(url, for_capacity, args.conns, 1000, relay_pid, args.capacity_seconds, 30.0)
            rate = rate or capacity["eps"] / 2
            print(f"ingest capacity: {capacity['eps']:,.0f} events/s OK true ({ingest.fmt(capacity)})", flush=True)
        loop0 = common.thread_schedstat(loop_pid)
        phase = loaded_phase(url, relay_pid, targets, for_load, rate, args.reps)
        loop_cpu, loop_wait = ((b - a) / phase["wall"] for a, b in zip(loop0, common.thread_schedstat(loop_pid)))
    finally:
        if srv:
            srv.stop()
    paced, loaded = phase["paced"], phase["loaded"]
    print(f"loaded phase: publishing {paced['rate']:,.0f} events/s (target {rate:,.0f}; "
          f"{paced['ok_true']:,} OK true, {paced['ok_false']:,} OK false{', RAN OUT of events' if paced['ran_out'] else ''}),"
          f" relay {phase['relay_cores']:.2f} cores, all processes {phase['busy_cores']:.2f} of {os.cpu_count()} cores")
    if loop_pid:
        # The event loop serves every REQ: the share of the phase it was ready to run but had no CPU is
        # latency that no relay code path can remove on this machine.
        print(f"event-loop thread: on a CPU {loop_cpu:.0%} of the loaded phase, runnable but waiting for a CPU"
              f" {loop_wait:.0%} (unloaded phase: {idle_wait:.0%})")
    worst = 0.0
    for name in REQ_QUERIES:
        a, b = idle.get(name, {}), loaded.get(name, {})
        if "p99_ms" not in a or "p99_ms" not in b:
            print(f"  {name:<12} no result: unloaded {a.get('errors')} loaded {b.get('errors')}")
            worst = float("inf")
            continue
        ratio = b["p99_ms"] / a["p99_ms"]
        worst = max(worst, ratio)
        print(f"  {name:<12} unloaded p50 {a['p50_ms']:7.2f} p99 {a['p99_ms']:7.2f} ms | loaded p50 {b['p50_ms']:7.2f}"
              f" p99 {b['p99_ms']:7.2f} ms | p99 ratio {ratio:5.2f} | events {a['returned_last']} / {b['returned_last']}")
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    print(f"worst p99 ratio loaded/unloaded: {worst:.2f} ({verdict} the {TARGET_RATIO:g}x target)")
    return 0 if worst <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
