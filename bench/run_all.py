"""One command for the whole side-by-side benchmark.

    bash bench/setup_refs.sh                 # once: reference relays in their own venvs
    .venv/bin/python bench/run_all.py        # ~8-12 min (first run: + ~6 min to build the
                                             # nostr-relay store cache and ~20 s of signing)

Runs, in this order, each stage on its own fresh server process:
  1. generator check: ingest against bench/null_server.py (1 and 4 connections)
  2. per relay (ours, nostr-relay, localrelay):
     ingest with 1 and 4 connections (fresh empty store, --ingest-duration seconds each),
     then a loaded store (100,000 events; 50,000 for LocalRelay, which keeps at most 75,000)
     for the REQ/COUNT latency suite, then fan-out on that same server;
     ours is also queried on a 50,000-event store so it can be compared with LocalRelay.
Prints tables with ratios ours / reference and writes bench/results/run-*.json and .txt.
A stage that fails is reported (error, server exit code, log tail) and the run goes on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import fanout  # noqa: E402
import ingest  # noqa: E402
import query  # noqa: E402
import stores  # noqa: E402

STORE_N = {"ours": 100_000, "nostr-relay": 100_000, "localrelay": 50_000}


def log(*a):
    common.eprint(time.strftime("%H:%M:%S"), *a)


def server_note(srv: common.Server | None) -> str:
    if srv is None or srv.proc is None:
        return ""
    if srv.proc.poll() is not None:
        return f" [server exited with {srv.proc.returncode}; log tail:\n{srv.tail(20)}]"
    return ""


def stage(results: dict, key: str, fn):
    t0 = time.perf_counter()
    try:
        results[key] = fn()
    except Exception as e:
        results[key] = {"error": f"{e!r}", "trace": traceback.format_exc()[-2000:]}
        log(f"{key}: FAILED {e!r}")
    results[key]["stage_s"] = time.perf_counter() - t0 if isinstance(results[key], dict) else None


def do_ingest(name: str, conns: int, duration: float, lines) -> dict:
    srv = (common.null_server(procs=1 if conns == 1 else 2) if name == "null"
           else common.FACTORIES[name]())
    srv.start()
    try:
        r = ingest.run_ingest(srv.url, lines, conns, 1000, srv.pid, duration=duration, grace=30,
                              reconnect_every=ingest.RECONNECT_EVERY.get(name, 0))
        note = server_note(srv)
        if note:
            r["server"] = note
        log(f"ingest {name} x{conns}: {ingest.fmt(r)}{note}")
        return r
    finally:
        srv.stop()


def do_store(name: str, n: int, reps: int, fanout_s: float, with_fanout: bool = True) -> dict:
    out: dict = {"n": n}
    store = query.model_store(events.load(n))
    targets = query.pick_targets(store)
    srv, info = stores.start_loaded(name, n, log=log)
    out["load"] = {k: v for k, v in info.items() if k != "load"}
    if "load" in info:
        out["load"]["publish"] = info["load"]
        log(f"{name} store load ({n:,}): {ingest.fmt(info['load'])}")
    try:
        out["rss_loaded"] = common.rss_detail(srv.pid)
        common.install_uvloop()
        c0, r0, s0, t0 = (common.self_cpu(), common.cpu_seconds(srv.pid), common.system_busy(),
                          time.perf_counter())
        out["queries"] = asyncio.run(query.bench_queries(srv.url, targets, store, reps))
        wall = time.perf_counter() - t0
        out["query_relay_cores"] = (common.cpu_seconds(srv.pid) - r0) / wall
        out["query_client_cores"] = (common.self_cpu() - c0) / wall
        out["query_other_cores"] = max(0.0, (common.system_busy() - s0) / wall
                                       - out["query_relay_cores"] - out["query_client_cores"])
        out["rss_after_queries"] = common.rss_detail(srv.pid)
        for r in out["queries"]:
            log(f"{name}@{n}: {query.fmt_row(r).strip()}")
        note = server_note(srv)
        if note:
            out["server_after_queries"] = note
            log(f"{name}: {note}")
            return out
        if with_fanout:
            try:
                f = fanout.run_fanout(srv.url, srv.pid, fanout_s,
                                      reconnect_every=ingest.RECONNECT_EVERY.get(name, 0), log=log)
                f["server"] = server_note(srv)
                out["fanout"] = f
                log(f"fanout {name}: {fanout.fmt(f)}{f['server']}")
            except Exception as e:
                out["fanout"] = {"error": repr(e), "server": server_note(srv),
                                 "trace": traceback.format_exc()[-2000:]}
                log(f"fanout {name}: FAILED {e!r}{server_note(srv)}")
        return out
    finally:
        srv.stop()


# ------------------------------------------------------------------ report
def _ratio(a, b) -> str:
    if a is None or b is None or not b or a != a or b != b:
        return "-"
    return f"{a / b:.2f}"


def _us_per(cpu_s, n) -> str:
    if cpu_s is None or not n:
        return "-"
    return f"{cpu_s / n * 1e6:,.0f}"


def report(res: dict, relays: list[str]) -> str:
    L = []
    refs = [r for r in relays if r != "ours"]
    L.append("== Ingest: EVENTs acknowledged with OK true per second "
             "(window 1,000 per connection; fresh store) ==")
    L.append("   'other' = cores busy with anything but relay and generator (other jobs on the "
             "machine); relay µs/ev = relay CPU per answered EVENT (less load-sensitive)")
    L.append(f"{'target':<12}{'conns':>6}{'ev/s OK':>11}{'all OK/s':>10}{'relay cores':>12}"
             f"{'gen cores':>10}{'other':>7}{'relay µs/ev':>12}{'OK false':>9}  "
             + "  ".join(f"ours/{r}" for r in refs))
    for name in ["null"] + relays:
        for c in (1, 4):
            r = res.get(f"ingest/{name}/{c}")
            if not r:
                continue
            if "error" in r and "eps" not in r:
                L.append(f"{name:<12}{c:>6}  ERROR {r['error'][:100]}")
                continue
            ratios = []
            for ref in refs:
                o = res.get(f"ingest/ours/{c}", {})
                f = res.get(f"ingest/{ref}/{c}", {})
                ratios.append(f"{_ratio(o.get('eps'), f.get('eps')):>{len('ours/' + ref)}}"
                              if name == "ours" else " " * len("ours/" + ref))
            rc = r.get("relay_cores")
            L.append(f"{name:<12}{c:>6}{r['eps']:>11,.0f}{r['acked_eps']:>10,.0f}"
                     f"{(f'{rc:.2f}' if rc is not None else '-'):>12}{r['gen_cores'] or 0:>10.2f}"
                     f"{r.get('other_cores', 0):>7.2f}{_us_per(r.get('relay_cpu_s'), r['acked']):>12}"
                     f"{r['ok_false']:>9,}  " + "  ".join(ratios))
            if r.get("errors"):
                L.append(f"{'':<12}errors: {r['errors'][:2]}")
    L.append("")
    # queries
    for base, n_ours in (("nostr-relay", 100_000), ("localrelay", 50_000)):
        cols = [x for x in (("ours", n_ours), (base, STORE_N[base])) if x[0] in relays]
        if not any(f"store/{c}/{n}" in res for c, n in cols):
            continue
        L.append(f"== REQ/COUNT latency, ms (p50 / p99), {n_ours:,}-event store"
                 f"{' (LocalRelay: 50,000)' if base == 'localrelay' else ''}; "
                 f"ratio = ours / {base} (<1: ours faster) ==")
        L.append(f"{'query':<13}" + "".join(f"{c + ' p50':>16}{c + ' p99':>16}" for c, _ in cols)
                 + (f"{'p50 ratio':>11}{'p99 ratio':>11}" if len(cols) == 2 else "") + "  rows")
        qs = {}
        for c, n in cols:
            st = res.get(f"store/{c}/{n}", {})
            for q in st.get("queries", []):
                qs.setdefault(q["query"], {})[c] = q
        for qn, per in qs.items():
            line = f"{qn:<13}"
            rows = []
            for c, _ in cols:
                q = per.get(c)
                if q and q.get("reps"):
                    line += f"{q['p50_ms']:>16.2f}{q['p99_ms']:>16.2f}"
                    mm = "" if q["match"] in (True, None) else " MISMATCH"
                    rows.append(f"{c}:{q['returned']}/{q['expected']}{mm}")
                else:
                    why = "unsupported" if q and q.get("unsupported") else (
                        str(q["errors"])[:14] if q else "-")
                    line += f"{why:>16}{'':>16}"
            if len(cols) == 2:
                a, b = per.get(cols[0][0]), per.get(cols[1][0])
                if a and b and a.get("reps") and b.get("reps"):
                    line += f"{_ratio(a['p50_ms'], b['p50_ms']):>11}{_ratio(a['p99_ms'], b['p99_ms']):>11}"
                else:
                    line += f"{'-':>11}{'-':>11}"
            L.append(line + "  " + " ".join(rows))
        for c, n in cols:
            st = res.get(f"store/{c}/{n}", {})
            if "query_relay_cores" in st:
                L.append(f"  ({c}@{n:,}: relay {st['query_relay_cores']:.2f} cores, client "
                         f"{st['query_client_cores']:.2f}, other load {st['query_other_cores']:.2f} "
                         f"during the suite)")
        L.append("")
    # fanout
    L.append("== Fan-out: 1,000 subscriptions on 100 connections, 1 publisher (window 100) ==")
    L.append(f"{'relay':<12}{'deliv/s':>10}{'delivered':>11}{'expected':>10}{'pub ev/s':>10}"
             f"{'relay cores':>12}{'other':>7}{'µs/deliv':>9}{'VmRSS idle/peak':>17}"
             f"{'RssAnon idle/peak':>19}  " +
             "  ".join(f"ours/{r}" for r in refs))
    for name in relays:
        st = res.get(f"store/{name}/{STORE_N[name]}", {})
        f = st.get("fanout")
        if not f:
            continue
        if "error" in f:
            L.append(f"{name:<12}ERROR {f['error'][:100]}")
            continue
        ratios = []
        for ref in refs:
            o = res.get(f"store/ours/{STORE_N['ours']}", {}).get("fanout", {})
            b = res.get(f"store/{ref}/{STORE_N[ref]}", {}).get("fanout", {})
            ratios.append(f"{_ratio(o.get('deliveries_per_s'), b.get('deliveries_per_s')):>{len('ours/' + ref)}}"
                          if name == "ours" else " " * len("ours/" + ref))
        vm = f"{f['rss_idle_mb']:.0f}/{f['rss_peak_mb']:.0f} MB"
        anon = f"{f['rssanon_idle_mb']:.0f}/{f['rssanon_peak_mb']:.0f} MB"
        L.append(f"{name:<12}{f['deliveries_per_s']:>10,.0f}{f['delivered']:>11,}{f['expected']:>10,}"
                 f"{f['publish_eps']:>10,.0f}{f['relay_cores'] or 0:>12.2f}"
                 f"{f.get('other_cores', 0):>7.2f}{_us_per(f.get('relay_cpu_s'), f['delivered']):>9}"
                 f"{vm:>17}{anon:>19}  " + "  ".join(ratios))
    L.append("")
    loads = []
    for name in relays:
        st = res.get(f"store/{name}/{STORE_N[name]}", {})
        ld = st.get("load", {})
        if ld:
            s = f"{name}: {ld.get('method')}"
            if "import_s" in ld:
                s += f", {ld['import_s']:.1f}s ({ld.get('import_eps', 0):,.0f} ev/s)"
            if "publish" in ld:
                s += f", {ld['publish']['eps']:,.0f} ev/s"
            if st.get("rss_loaded"):
                s += (f"; VmRSS/RssAnon after load {st['rss_loaded']['vmrss_mb']:.0f}/"
                      f"{st['rss_loaded']['rssanon_mb']:.0f} MB")
            if st.get("rss_after_queries"):
                s += (f", after queries {st['rss_after_queries']['vmrss_mb']:.0f}/"
                      f"{st['rss_after_queries']['rssanon_mb']:.0f} MB")
            loads.append(s)
    if loads:
        L.append("Store loading: " + "; ".join(loads))
    return "\n".join(L)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--relays", nargs="+", default=["ours", "nostr-relay", "localrelay"])
    ap.add_argument("--ingest-duration", type=float, default=15.0)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--fanout-duration", type=float, default=10.0)
    ap.add_argument("--skip-null", action="store_true")
    ap.add_argument("--no-ours-50k", action="store_true")
    ap.add_argument("--report", metavar="RUN.json", help="only print the tables of a saved run")
    args = ap.parse_args()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(report(saved, saved["relays"]))
        return

    t0 = time.time()
    relays = []
    for r in args.relays:
        if r == "ours":
            ok, why = common.ours_available()
            if not ok:
                log(f"ours: not available ({why}); skipped")
                continue
        elif not common.refs_installed().get(r):
            log(f"{r}: not installed; run bash bench/setup_refs.sh; skipped")
            continue
        relays.append(r)
    log("events: loading / signing")
    lines = events.load(100_000)
    events.load(fanout.LIVE_N, seed=events.LIVE_SEED, base_ts=events.LIVE_BASE_TS)
    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "relays": relays,
                 "args": vars(args)}
    if not args.skip_null:
        for c in (1, 4):
            stage(res, f"ingest/null/{c}", lambda c=c: do_ingest("null", c, args.ingest_duration, lines))
    for name in relays:
        for c in (1, 4):
            stage(res, f"ingest/{name}/{c}",
                  lambda name=name, c=c: do_ingest(name, c, args.ingest_duration, lines))
        n = STORE_N[name]
        stage(res, f"store/{name}/{n}",
              lambda name=name, n=n: do_store(name, n, args.reps, args.fanout_duration))
        if name == "ours" and not args.no_ours_50k and "localrelay" in relays:
            stage(res, "store/ours/50000",
                  lambda: do_store("ours", 50_000, args.reps, args.fanout_duration, False))
    res["total_s"] = time.time() - t0
    text = report(res, relays)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common.RESULTS.mkdir(exist_ok=True)
    (common.RESULTS / f"run-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (common.RESULTS / f"run-{stamp}.txt").write_text(text + "\n")
    print(text)
    print(f"\n(total {res['total_s'] / 60:.1f} min; bench/results/run-{stamp}.json / .txt)")


if __name__ == "__main__":
    main()
