"""Scaling with worker processes: ours with `[server] workers` = 0, 1, 2 (issue 16), in one run.

    .venv/bin/python bench/scaling.py                                        # workers 0 1 2, 100k events
    .venv/bin/python bench/scaling.py --workers 0 --n 5000 --req-seconds 3   # smoke run

Per worker count, one `relay serve --workers N` on a fresh store (started here, stopped by its process group;
a tree whose `relay serve` has no --workers runs only N = 0, its single process):
1. ingest: bench/ingest.py's generator (--conns processes, 1,000 EVENTs in flight each) publishes the first
   --n events: events/s OK true, relay CPU-seconds per 1,000 events (the whole process tree).  The writer's
   µs per event, two ways: the writer process's own CPU during the ingest / events stored (with workers >= 1
   the parent process is the writer; with 0 one process also serves the connections, so the figure holds
   both), and the write transactions' wall time per event from /metrics (relay_writer_commit_seconds_sum /
   relay_events_stored_total).  1e6 / writer µs is the rate the writer alone allows.
2. REQ throughput on that store: --req-procs processes x --req-conns connections, each running query.py's
   REQ shapes in turn (REQ, wait for EOSE, CLOSE, the next) for --req-seconds: queries answered per second,
   relay CPU-seconds per 1,000 queries.  EVENT frames are counted, not parsed, to keep the clients cheap.
Then each figure against workers = 0, with the issue's gate (ingest with 2 workers >= 1.3x) and goal (REQ
throughput with 2 workers >= 1.6x).  The clients share the machine with the relay: "other" is the CPU busy
with anything but the relay.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import ingest  # noqa: E402
import query  # noqa: E402
from wsraw import WSClient  # noqa: E402

INGEST_GATE, REQ_GOAL = 1.3, 1.6  # issue 16: 2 workers against workers = 0


# ---------------------------------------------------------------- /metrics
def metric_sums(port: int, names: tuple[str, ...]) -> dict[str, float]:
    """Each metric of `names` from the relay's GET /metrics, summed over its label sets (absent: 0.0)."""
    with urllib.request.urlopen(f"http://{common.HOST}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


WRITER_METRICS = ("relay_writer_commit_seconds_sum", "relay_events_stored_total")


# ---------------------------------------------------------------- REQ throughput
async def _req_client(url: str, specs: list, conns: int, seconds: float, barrier, seed: int) -> dict:
    rng = random.Random(seed)
    st = {"answered": 0, "closed": 0, "timeouts": 0, "events": 0}
    clients = []
    for _ in range(conns):
        box: dict = {}

        def on_msg(m: bytes, box=box) -> None:  # EVENTs never get here (count_prefix)
            if (m.startswith(b'["EOSE"') or m.startswith(b'["CLOSED"')) and not box["fut"].done():
                box["fut"].set_result(m.startswith(b'["EOSE"'))
        clients.append((await WSClient.connect(url, on_msg, count_prefix=b'["EVENT"'), box))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, barrier.wait)
    stop_at = time.perf_counter() + seconds

    async def run(ws: WSClient, box: dict, first: int) -> None:
        i = first
        while time.perf_counter() < stop_at and not ws.is_closed:
            _, _, flt = specs[i % len(specs)]
            i += 1
            box["fut"] = loop.create_future()
            ws.send(json.dumps(["REQ", "q", flt(rng) if callable(flt) else flt]).encode())
            try:
                eose = await asyncio.wait_for(box["fut"], 10.0)
            except asyncio.TimeoutError:
                st["timeouts"] += 1
                continue
            if time.perf_counter() <= stop_at:
                st["answered" if eose else "closed"] += 1
            ws.send(b'["CLOSE","q"]')

    await asyncio.gather(*(run(ws, box, k) for k, (ws, box) in enumerate(clients)))
    st["events"] = sum(ws.prefix_count for ws, _ in clients)
    await asyncio.gather(*(ws.close(1.0) for ws, _ in clients))
    return st


def _req_process(url, specs, conns, seconds, barrier, out, seed) -> None:
    common.install_uvloop()
    try:
        out.put(asyncio.run(_req_client(url, specs, conns, seconds, barrier, seed)))
    except Exception as e:  # report, never hang the parent
        out.put({"error": repr(e)})


def req_throughput(url: str, relay_pid: int, targets: dict, procs: int, conns: int, seconds: float) -> dict:
    """query.py's REQ shapes on procs x conns connections for `seconds`: {"qps", "answered", "closed",
    "timeouts", "events", "relay_cpu_s", "other_cores", "errors"}; CLOSED answers are not counted as answered."""
    specs = [s for s in query.query_specs(targets) if s[1] == "REQ"]
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=_req_process, args=(url, specs, conns, seconds, barrier, out, k), daemon=True)
               for k in range(procs)]
    for w in workers:
        w.start()
    barrier.wait(timeout=120)
    cpu0, busy0, t0 = common.cpu_seconds(relay_pid), common.system_busy(), time.perf_counter()
    results = [out.get(timeout=seconds + 60) for _ in workers]
    wall = time.perf_counter() - t0
    relay_cpu = common.cpu_seconds(relay_pid) - cpu0
    for w in workers:
        w.join(5)
    ok = [r for r in results if "error" not in r]
    r = {k: sum(x[k] for x in ok) for k in ("answered", "closed", "timeouts", "events")}
    r.update(qps=r["answered"] / seconds, relay_cpu_s=relay_cpu, errors=[x["error"] for x in results if "error" in x],
             other_cores=max(0.0, common.system_busy() - busy0 - relay_cpu) / wall)
    return r


# ---------------------------------------------------------------- one worker count
def run_one(workers: int, lines: list[bytes], targets: dict, args) -> dict:
    """Ingest then REQ throughput on a fresh `relay serve` with `workers` worker processes."""
    srv = common.ours(workers=workers).start()
    try:
        m0 = metric_sums(srv.port, WRITER_METRICS)
        own0 = common.cpu_seconds(srv.pid, tree=False)
        r = ingest.run_ingest(srv.url, lines, args.conns, 1000, srv.pid, duration=args.ingest_seconds, grace=60)
        own = common.cpu_seconds(srv.pid, tree=False) - own0
        m1 = metric_sums(srv.port, WRITER_METRICS)
        # /metrics answered by one worker counts only that worker's share until it reports the whole relay
        # (prometheus multiprocess mode); the events answered OK true are the events stored then
        stored = m1["relay_events_stored_total"] - m0["relay_events_stored_total"]
        commit_s = m1["relay_writer_commit_seconds_sum"] - m0["relay_writer_commit_seconds_sum"]
        out = {"workers": workers, "ingest": r, "stored": stored,
               "writer_cpu_us": own / (stored or r["ok_true"]) * 1e6 if stored or r["ok_true"] else None,
               "commit_us": commit_s / stored * 1e6 if stored and commit_s else None}
        out["req"] = req_throughput(srv.url, srv.pid, targets, args.req_procs, args.req_conns, args.req_seconds)
        out["rss"] = common.rss_detail(srv.pid)
        out["processes"] = len(common.tree_pids(srv.pid))
        return out
    finally:
        srv.stop()


def _per_1000(cpu_s, n) -> str:
    return f"{cpu_s / n * 1000:.3f}" if cpu_s is not None and n else "-"


def report(runs: list[dict], args) -> str:
    base = next((x for x in runs if x["workers"] == 0), None)
    L = ["== Scaling: ours with [server] workers = N (same events, fresh store each) ==",
         f"{'workers':>7}{'procs':>6}{'ingest ev/s':>12}{'x0':>6}{'CPU-s/1k ev':>12}{'writer µs/ev':>13}"
         f"{'commit µs/ev':>13}{'writer max ev/s':>16}{'REQ/s':>9}{'x0':>6}{'CPU-s/1k REQ':>13}{'relay cores':>12}"
         f"{'other':>7}"]
    for x in runs:
        i, q = x["ingest"], x["req"]
        ix = f"{i['eps'] / base['ingest']['eps']:.2f}" if base and base["ingest"]["eps"] else "-"
        qx = f"{q['qps'] / base['req']['qps']:.2f}" if base and base["req"]["qps"] else "-"
        wus, cus = x["writer_cpu_us"], x["commit_us"]
        L.append(f"{x['workers']:>7}{x['processes']:>6}{i['eps']:>12,.0f}{ix:>6}{_per_1000(i['relay_cpu_s'], i['acked']):>12}"
                 f"{(f'{wus:.0f}' if wus else '-'):>13}{(f'{cus:.0f}' if cus else '-'):>13}"
                 f"{(f'{1e6 / wus:,.0f}' if wus and x['workers'] else '-'):>16}{q['qps']:>9,.0f}{qx:>6}"
                 f"{_per_1000(q['relay_cpu_s'], q['answered']):>13}{q['relay_cpu_s'] / args.req_seconds:>12.2f}"
                 f"{q['other_cores']:>7.2f}")
        for e in i["errors"][:2] + q["errors"][:2]:
            L.append(f"{'':>7}error: {e}")
        if q["closed"] or q["timeouts"]:
            L.append(f"{'':>7}REQs CLOSED {q['closed']}, unanswered within 10 s {q['timeouts']}")
    two = next((x for x in runs if x["workers"] == 2), None)
    if base and two:
        gi = two["ingest"]["eps"] / base["ingest"]["eps"]
        gq = two["req"]["qps"] / base["req"]["qps"]
        L.append(f"gate: ingest 2 workers / 0 = {gi:.2f} ({'met' if gi >= INGEST_GATE else 'MISSED'}, >= {INGEST_GATE});"
                 f" goal: REQ 2 workers / 0 = {gq:.2f} ({'met' if gq >= REQ_GOAL else 'MISSED'}, >= {REQ_GOAL})")
    L.append("writer µs/ev: the writer process's CPU per event stored (workers = 0: the one process, connections "
             "included); commit µs/ev: write-transaction wall time per event (/metrics); writer max ev/s = 1e6 / "
             "writer µs/ev; relay cores: its CPU per second of the REQ phase; other: the rest of the machine's (the "
             f"REQ clients included), of {os.cpu_count()} cores")
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n", type=int, default=100_000, help="events published (seed 1), then queried")
    ap.add_argument("--conns", type=int, default=4, help="ingest connections, one process each")
    ap.add_argument("--ingest-seconds", type=float, default=600.0, help="stop publishing after this")
    ap.add_argument("--req-procs", type=int, default=2, help="REQ client processes")
    ap.add_argument("--req-conns", type=int, default=16, help="connections per REQ client process")
    ap.add_argument("--req-seconds", type=float, default=20.0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if any(args.workers) and not common.ours_has_workers():
        ap.error("this tree's `relay serve` has no --workers (issue 16's worker processes): only --workers 0 runs")
    lines = events.load(args.n)
    targets = query.pick_targets(query.model_store(lines))
    runs = []
    for w in args.workers:
        x = run_one(w, lines, targets, args)
        common.eprint(f"workers={w}: ingest {ingest.fmt(x['ingest'])}; REQ {x['req']['qps']:,.0f}/s")
        runs.append(x)
    print(report(runs, args))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":
    main()
