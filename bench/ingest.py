"""Ingest load generator: pipelined EVENT publishing, counted by OK.

    .venv/bin/python bench/ingest.py --null --conns 1 4          # generator check vs null_server
    .venv/bin/python bench/ingest.py --relay nostr-relay --conns 1 4 --n 100000
    .venv/bin/python bench/ingest.py --url ws://127.0.0.1:7777 --relay-pid 1234 --conns 4

One OS process per connection (multiprocessing, fork).  Each keeps up to --window (default
1,000) EVENTs sent but not yet answered, and counts OK replies.  All connections start
together (barrier) and stop sending new events after --duration seconds (or when their
shard is exhausted), then wait up to --grace seconds for the outstanding OKs.
Reported: events/s acknowledged with OK true = OK-true count / (last OK - first send),
the generator processes' own CPU (os.times in each), and the relay's CPU from
/proc/PID/stat utime+stime of the relay process tree before/after.

With --relay NAME or --null the script starts a fresh server itself (fresh database) and
stops it afterwards; with --url it measures whatever listens there.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import sys
import time

import orjson

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
from wsraw import WSClient, WSClosed  # noqa: E402

# LocalRelay (nostr-sdk 0.45) closes a connection after 6,000 messages in a minute
# ("too many client messages"); the Python builder has no setter for that limit.
RECONNECT_EVERY = {"localrelay": 5900}

_LINES: list[bytes] = []  # set in the parent before fork; children inherit it


async def _worker_main(idx, lo, hi, url, window, barrier, duration, grace, reconnect_every):
    msgs = [events.event_message(_LINES[i]) for i in range(lo, hi)]
    total = len(msgs)
    st = {"idx": idx, "sent": 0, "ok_true": 0, "ok_false": 0, "other": 0,
          "reasons": {}, "notices": [], "error": None, "connections": 0}
    acked = 0
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    t_last = [0.0]
    low = max(1, window * 3 // 4)

    def on_msg(m: bytes, conn: dict):
        nonlocal acked
        if m.startswith(b'["OK"'):
            acked += 1
            conn["acked"] += 1
            t_last[0] = time.perf_counter()
            try:
                r = orjson.loads(m)
                ok = r[2] is True
                reason = str(r[3]) if len(r) > 3 else ""
            except Exception:
                ok, reason = False, "unparseable OK"
            if ok:
                st["ok_true"] += 1
            else:
                st["ok_false"] += 1
                key = reason[:120]
                st["reasons"][key] = st["reasons"].get(key, 0) + 1
            if st["sent"] - acked <= low:
                wake.set()
        elif m.startswith(b'["NOTICE"'):
            st["other"] += 1
            if len(st["notices"]) < 5:
                st["notices"].append(m[:300].decode(errors="replace"))
        else:
            st["other"] += 1

    async def connect():
        st["connections"] += 1
        conn = {"sent": 0, "acked": 0}
        w = await WSClient.connect(url, lambda m: on_msg(m, conn), quickack=False)
        return w, conn

    try:
        ws, conn = await connect()
    except Exception as e:
        await loop.run_in_executor(None, barrier.wait)
        st["error"] = f"connect: {e!r}"
        return st
    await loop.run_in_executor(None, barrier.wait)
    cpu0 = common.self_cpu()
    t0 = time.perf_counter()
    stop_at = t0 + duration
    old: list[tuple[WSClient, dict]] = []  # rotated-out connections, kept until answered
    try:
        sent = 0
        while sent < total and time.perf_counter() < stop_at:
            room = window - (sent - acked)
            if room <= 0:
                wake.clear()
                if ws.is_closed:
                    raise WSClosed("closed by server")
                try:  # short timeout: notice a connection the relay closed
                    await asyncio.wait_for(wake.wait(), max(0.01, min(0.2, stop_at - time.perf_counter())))
                except asyncio.TimeoutError:
                    pass
                continue
            if reconnect_every and conn["sent"] >= reconnect_every:
                # relay-imposed per-connection message budget (LocalRelay): keep the old
                # connection open until its OKs are in, continue on a fresh one
                old.append((ws, conn))
                ws, conn = await connect()
            k = min(room, 100, total - sent)
            if reconnect_every:
                k = min(k, reconnect_every - conn["sent"])
            ws.send_many(msgs[sent:sent + k])
            sent += k
            conn["sent"] += k
            st["sent"] = sent
            await ws.drain()
            while old and old[0][1]["acked"] >= old[0][1]["sent"]:
                await old.pop(0)[0].close(0.5)
        t_stop_send = time.perf_counter()
        end = t_stop_send + grace
        while acked < sent and time.perf_counter() < end:
            if ws.is_closed:
                raise WSClosed("closed by server while waiting for OKs")
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
        st["unacked_at_end"] = sent - acked
    except (WSClosed, ConnectionError) as e:
        st["error"] = f"connection closed after {st['sent']} sent, {acked} acked: {e!r}"
        st["unacked_at_end"] = st["sent"] - acked
    st["acked"] = acked
    st["t_first"] = t0
    st["t_last"] = t_last[0] or time.perf_counter()
    st["elapsed"] = st["t_last"] - t0
    st["cpu"] = common.self_cpu() - cpu0
    for w, _ in old:
        await w.close(0.5)
    await ws.close(1.0)
    return st


def _worker(idx, lo, hi, url, window, barrier, q, duration, grace, reconnect_every):
    common.install_uvloop()
    try:
        st = asyncio.run(_worker_main(idx, lo, hi, url, window, barrier, duration, grace,
                                      reconnect_every))
    except Exception as e:  # report, never hang the parent
        st = {"idx": idx, "error": repr(e), "sent": 0, "ok_true": 0, "ok_false": 0,
              "other": 0, "reasons": {}, "notices": [], "cpu": 0.0, "elapsed": 0.0}
    q.put(st)


def run_ingest(url: str, lines: list[bytes], conns: int, window: int = 1000,
               relay_pid: int | None = None, duration: float = 60.0,
               grace: float = 30.0, reconnect_every: int = 0) -> dict:
    """Publish `lines` split over `conns` processes; returns a result dict."""
    global _LINES
    _LINES = lines
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(conns + 1)
    q = ctx.Queue()
    per = len(lines) // conns
    procs = []
    for i in range(conns):
        lo, hi = i * per, (i + 1) * per if i < conns - 1 else len(lines)
        p = ctx.Process(target=_worker, args=(i, lo, hi, url, window, barrier, q, duration, grace,
                                                     reconnect_every),
                        daemon=True)
        p.start()
        procs.append(p)
    try:
        barrier.wait(timeout=120)
    except Exception as e:
        for p in procs:
            p.kill()
        raise RuntimeError(f"workers did not get ready: {e!r}")
    rcpu0 = common.cpu_seconds(relay_pid) if relay_pid else None
    sys0 = common.system_busy()
    w0 = time.perf_counter()
    results = []
    deadline = time.time() + duration + grace + 60
    while len(results) < conns and time.time() < deadline:
        try:
            results.append(q.get(timeout=1.0))
        except Exception:
            if not any(p.is_alive() for p in procs) and q.empty():
                break
    wall = time.perf_counter() - w0
    rcpu1 = common.cpu_seconds(relay_pid) if relay_pid else None
    sys_busy = common.system_busy() - sys0
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    results.sort(key=lambda r: r["idx"])
    firsts = [r["t_first"] for r in results if "t_first" in r]
    lasts = [r["t_last"] for r in results if "t_last" in r]
    span = (max(lasts) - min(firsts)) if firsts else float("nan")
    ok_true = sum(r["ok_true"] for r in results)
    reasons: dict[str, int] = {}
    for r in results:
        for k, v in r["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    out = {
        "conns": conns, "window": window, "sent": sum(r["sent"] for r in results),
        "ok_true": ok_true, "ok_false": sum(r["ok_false"] for r in results),
        "other_msgs": sum(r["other"] for r in results),
        "unacked": sum(r.get("unacked_at_end", 0) for r in results),
        "acked": sum(r.get("acked", 0) for r in results),
        "connections": sum(r.get("connections", 0) for r in results),
        "seconds": span, "eps": ok_true / span if span and span > 0 else 0.0,
        "gen_cpu_s": sum(r["cpu"] for r in results),
        "relay_cpu_s": (rcpu1 - rcpu0) if relay_pid else None,
        "wall_s": wall,
        "errors": [r["error"] for r in results if r.get("error")],
        "reasons": reasons,
        "notices": [n for r in results for n in r["notices"]][:5],
        "workers_reported": len(results),
    }
    out["acked_eps"] = out["acked"] / span if span and span > 0 else 0.0
    out["gen_cores"] = out["gen_cpu_s"] / span if span and span > 0 else None
    out["relay_cores"] = (out["relay_cpu_s"] / span) if relay_pid and span and span > 0 else None
    # CPU used by anything else on the machine during the run (other users' jobs, the
    # harness parent): all busy CPU minus relay and generator, per second of the run
    out["other_cores"] = max(0.0, sys_busy - out["gen_cpu_s"] - (out["relay_cpu_s"] or 0)) / wall
    return out


def fmt(r: dict) -> str:
    s = (f"conns={r['conns']} window={r['window']}: {r['eps']:,.0f} ev/s OK-true "
         f"({r['ok_true']:,}/{r['sent']:,} sent in {r['seconds']:.2f}s; OK-false {r['ok_false']:,}, "
         f"unacked {r['unacked']:,}; all OKs {r['acked_eps']:,.0f}/s; "
         f"{r['connections']} ws connection(s) opened) gen CPU {r['gen_cpu_s']:.2f}s")
    if r.get("gen_cores") is not None:
        s += f" ({r['gen_cores']:.2f} cores)"
    if r["relay_cpu_s"] is not None:
        s += f", relay CPU {r['relay_cpu_s']:.2f}s ({r['relay_cores']:.2f} cores)"
    s += f", other load {r.get('other_cores', 0):.2f} cores"
    if r["errors"]:
        s += f"\n    errors: {r['errors']}"
    if r["reasons"]:
        s += f"\n    OK-false reasons: {dict(list(r['reasons'].items())[:5])}"
    if r["notices"]:
        s += f"\n    notices: {r['notices']}"
    return s


def main() -> None:
    ap, g = common.target_parser(__doc__)
    g.add_argument("--null", action="store_true", help="start bench/null_server.py and use it")
    ap.add_argument("--relay-pid", type=int, help="with --url: PID whose CPU to account")
    ap.add_argument("--conns", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--n", type=int, default=100_000, help="events available (seed 1)")
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--duration", type=float, default=20.0, help="stop sending after this")
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--null-procs", type=int, default=1)
    ap.add_argument("--reconnect-every", type=int, default=None,
                    help="open a fresh connection after this many EVENTs (default: 5900 for "
                         "localrelay, whose 0.45 Python API cannot lift its 6,000 messages/"
                         "minute/connection limit; 0 elsewhere)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()

    lines = events.load(args.n)
    res = []
    for c in args.conns:
        srv = None
        if args.null:
            srv = common.null_server(procs=args.null_procs).start()
        elif args.relay:
            srv = common.FACTORIES[args.relay]().start()
        try:
            url = srv.url if srv else args.url
            pid = srv.pid if srv else args.relay_pid
            rec = args.reconnect_every
            if rec is None:
                rec = RECONNECT_EVERY.get(args.relay or "", 0)
            r = run_ingest(url, lines, c, args.window, pid, args.duration, args.grace, rec)
            r["target"] = "null" if args.null else (args.relay or args.url)
            print(f"{r['target']}: {fmt(r)}", flush=True)
            res.append(r)
        finally:
            if srv:
                srv.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
