"""NIP-77 reconciliation benchmark: nostr-tools' client (Node) against our relay, and LocalRelay.

    .venv/bin/python bench/negentropy_sync.py [--sizes 100000 1000000] [--diffs 0.01 0.1]
        [--frame 60000] [--reps 3] [--big-reps 1] [--localrelay-n 50000] [--ingest-n 100000]
        [--ingest-reps 2] [--floor-sizes 100000] [--skip-localrelay] [--skip-ingest]

Needs `npm install` in bench/js once (nostr-tools 2.25.2) and Node 20+ (the built-in WebSocket,
behind --experimental-websocket in Node 20).  Output: tables on stdout, everything in
bench/results/negentropy-<stamp>.json.

Sets.  The seeded stream of bench/events.py (seed 1, 1,000 authors, signed).  Kinds 0 and 3 are
replaceable, so a relay holding the first L events of the stream stores fewer than L; the store of
size N is therefore "the stream's first events, replaced ones left out, until exactly N remain"
(written once to bench/results/neg/stored-N.jsonl, so the kind mix is kept and every event the
relay holds is a real signed event).  Our relay loads it with `relay import` into a database cached
as bench/results/neg/ours-N.db (checked after import: its events and its `{}` negentropy items are
exactly the N (created_at, id) pairs); LocalRelay gets it by publishing (it is in-memory).

Differences.  "d difference" = each side holds d/2 of the items that the other lacks: the client
holds the relay's N items minus a seeded random d*N/2 of them ("need"), plus d*N/2 items the
relay does not hold ("have": ids from sha256 of a counter, created_at drawn from the set's
timestamps; only (created_at, id) pairs, never uploaded).  So both sides hold N items.

Timing.  One Node process per reconciliation (bench/js/neg_client.mjs): builds its
NegentropyStorageVector (build time reported apart), opens the WebSocket, then from NEG-OPEN to the
last reconcile() returning null is the "wall to full have/need".  Per round: bytes each way
(WebSocket text frame sizes), round-trip time, client reconcile() time and the relay's CPU
(utime+stime of its process tree from /proc/PID/stat, read by the client right before it sends and
right after it receives, 10 ms clock ticks).  have/need are compared with the known differences.

First run: the 1,000,000 store needs ~1.08M stream events (bench/events.py signs them once, ~3.5 min
on 2 busy cores, ~630 MB cached) and a `relay import` of ~5.5 min (1.5 GB database, cached with
its set check in bench/results/neg/ours-1000000.db); later runs reuse both.  The stream passes
"now" (late 2026) after ~330,000 events, so every import here runs with
RELAY_LIMITS__MAX_CREATED_AT_FUTURE_SECONDS=40000000 (otherwise later events are rejected).
--ours-env passes settings to our relay, e.g. RELAY_NEGENTROPY__FRAME_SIZE_LIMIT=60000 to answer
with the same frame size as the client (and as LocalRelay).

Client floor (--floor-sizes, default 100,000): bench/js/neg_inprocess.mjs runs the same client
(nostr-tools' initiator, --frame) against nostr-tools' own responder (frame 500,000) in one Node
process, on the same two sets: no socket, no relay.  Its wall time is what a relay costing nothing
would give this client; its initiator time is the client's share of any relay's wall time.

Ingest with the negentropy index on and off: `relay import` of the same stored-N.jsonl into a fresh
database with RELAY_NEGENTROPY__ENABLED=true / false, alternating, events/s = N / wall and the
import process's CPU-seconds per event.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import sqlite3
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import events  # noqa: E402
import stores  # noqa: E402

from relay.store import db as store_db  # noqa: E402
from relay.config import Config  # noqa: E402
from relay.hooks import negentropy_hook  # noqa: E402
from relay.store.negentropy import indexed_items  # noqa: E402

NEG = common.RESULTS / "neg"
JS = common.BENCH / "js"
CLIENT = JS / "neg_client.mjs"
FLOOR = JS / "neg_inprocess.mjs"
RELAY_EXE = common.REPO / ".venv" / "bin" / "relay"
REPLACEABLE = {0, 3}
FUTURE_SECONDS = 40_000_000


def log(*a) -> None:
    common.eprint(time.strftime("%H:%M:%S"), *a)


def load_avg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---------------------------------------------------------------- sets
def stored_set(n: int) -> tuple[Path, list[tuple[int, bytes]]]:
    """The stream's first events, superseded replaceable events left out, until exactly n remain.
    Returns the JSONL file (stream order) and the (created_at, id) items."""
    NEG.mkdir(parents=True, exist_ok=True)
    path = NEG / f"stored-{n}.jsonl"
    # about 7% of the stream is replaceable, mostly superseded: the stream needs ~8% more than n
    cached = sorted(common.RESULTS.glob(events.cache_path(1).name.rsplit("-n", 1)[0] + "-n*.jsonl"),
                    key=lambda p: int(p.stem.rsplit("-n", 1)[1]))
    src = next((p for p in cached if int(p.stem.rsplit("-n", 1)[1]) >= n * 1.08 + 3000), None) \
        or (cached[-1] if cached and int(cached[-1].stem.rsplit("-n", 1)[1]) >= n else None) \
        or events.generate(int(n * 1.08) + 3000)
    kept: dict[int, tuple[int, bytes, bytes]] = {}  # stream index -> (created_at, id, line)
    latest: dict[tuple[str, int], int] = {}
    with open(src, "rb") as f:
        for i, line in enumerate(f):
            ev = orjson.loads(line)
            k = ev["kind"]
            assert k in (0, 1, 3, 7), k
            if k in REPLACEABLE:
                key = (ev["pubkey"], k)
                old = latest.get(key)
                if old is not None:
                    del kept[old]
                latest[key] = i
            kept[i] = (ev["created_at"], bytes.fromhex(ev["id"]), line)
            if len(kept) == n:
                break
    if len(kept) != n:
        raise RuntimeError(f"{src} too short for a store of {n}")
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for i in sorted(kept):
                f.write(kept[i][2])
        os.replace(tmp, path)
    return path, [(ts, eid) for ts, eid, _ in kept.values()]


def run_import(jsonl: Path, db: Path, enabled: bool = True) -> dict:
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    # the seeded stream advances ~20 s per event from 2026-08-29, so past ~330,000 events it is
    # dated after "now" (late 2026): the import allows created_at up to ~15 months ahead
    env = dict(os.environ, RELAY_NEGENTROPY__ENABLED="true" if enabled else "false",
               RELAY_LIMITS__MAX_CREATED_AT_FUTURE_SECONDS=str(FUTURE_SECONDS))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([str(RELAY_EXE), "import", "--create", str(jsonl), "--db", str(db)], cwd=common.REPO,
                       env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0 or "rejected 0" not in r.stdout:
        raise RuntimeError(f"relay import failed ({r.returncode}): {(r.stdout + r.stderr)[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "out": r.stdout.strip()[-300:], "load": load_avg()}


def check_db(db: Path, items: list[tuple[int, bytes]]) -> dict:
    """events and the `{}` negentropy items of db hold exactly `items`."""
    want = set(items)
    con = sqlite3.connect(db, isolation_level=None)
    try:
        # as `relay serve` does at start (default config): migrate, and (re)build the indexes if their
        # layout changed; the default's index set, or the serve after it would rebuild the public one
        store_db.migrate(con)
        negentropy_hook(Config()).setup(con)
        ev = set(con.execute("SELECT created_at, id FROM events"))
        row = con.execute("SELECT filter_no FROM neg_filters WHERE spec = '{}'").fetchone()
        neg = set(indexed_items(con, row[0])) if row else set()
    finally:
        con.close()
    return {"events_exact": ev == want, "neg_items_exact": neg == want, "events": len(ev),
            "neg_items": len(neg)}


def ours_db(n: int, jsonl: Path, items: list[tuple[int, bytes]]) -> tuple[Path, dict]:
    db = NEG / f"ours-{n}.db"
    info: dict = {}
    if not db.exists() or not (NEG / f"ours-{n}.ok").exists():
        log(f"ours: relay import of {n:,} events -> {db.name}")
        info["import"] = run_import(jsonl, db)
        log(f"ours: imported in {info['import']['wall_s']:.1f}s "
            f"({n / info['import']['wall_s']:,.0f} ev/s): {info['import']['out']}")
    check = check_db(db, items)
    info["check"] = check
    if not (check["events_exact"] and check["neg_items_exact"]):
        raise RuntimeError(f"{db}: store differs from the set: {check}")
    (NEG / f"ours-{n}.ok").write_text("checked\n")
    return db, info


def items_file(items: list[tuple[int, bytes]], path: Path) -> Path:
    """`items` as the Node scripts' 36-byte records (uint32 LE created_at, 32-byte id)."""
    pack = struct.Struct("<I32s").pack
    with open(path, "wb") as f:
        for ts, eid in items:
            f.write(pack(ts, eid))
    return path


def client_side(items: list[tuple[int, bytes]], diff: float, seed: int
                ) -> tuple[Path, set[str], set[str]]:
    """Items file for the Node client, expected have (client-only) and need (relay-only) ids."""
    n = len(items)
    half = int(round(n * diff / 2))
    rng = random.Random(f"neg-client:{seed}:{n}:{diff}")
    drop = set(rng.sample(range(n), half))
    ts_pool = [ts for ts, _ in items]
    extra = []
    for i in range(half):
        eid = hashlib.sha256(f"neg-bench-client-only:{seed}:{n}:{diff}:{i}".encode()).digest()
        extra.append((rng.choice(ts_pool), eid))
    path = items_file([item for j, item in enumerate(items) if j not in drop] + extra, NEG / f"client-{n}-{diff}.bin")
    need = {items[j][1].hex() for j in drop}
    have = {eid.hex() for _, eid in extra}
    return path, have, need


def reconcile(srv: common.Server, items_bin: Path, frame: int, have: set[str], need: set[str],
              timeout: float) -> dict:
    out = NEG / f"client-out-{srv.port}.json"
    out.unlink(missing_ok=True)
    pids = ",".join(str(p) for p in common.tree_pids(srv.pid))
    busy0, cpu0, t0 = common.system_busy(), common.cpu_seconds(srv.pid), time.perf_counter()
    r = subprocess.run(["node", "--experimental-websocket", "--no-warnings", str(CLIENT), srv.url,
                        str(items_bin), str(frame), pids, str(out)], cwd=JS, capture_output=True,
                       text=True, timeout=timeout)
    elapsed = time.perf_counter() - t0
    if not out.exists():
        raise RuntimeError(f"client wrote nothing (rc {r.returncode}): {(r.stdout + r.stderr)[-800:]}")
    res = json.loads(out.read_text())
    out.unlink()
    got_have, got_need = set(res.pop("have")), set(res.pop("need"))
    rounds = res["rounds"]
    res.update({
        "round_trips": len(rounds),
        "up_bytes": sum(x["up_bytes"] for x in rounds),
        "down_bytes": sum(x["down_bytes"] for x in rounds),
        "relay_cpu_rounds_s": sum(x["relay_cpu_s"] for x in rounds),
        "have": len(got_have), "need": len(got_need),
        "have_exact": got_have == have, "need_exact": got_need == need,
        "expected_have": len(have), "expected_need": len(need),
        "relay_cpu_process_s": common.cpu_seconds(srv.pid) - cpu0,
        "other_cores": max(0.0, (common.system_busy() - busy0 - (common.cpu_seconds(srv.pid) - cpu0))
                           / elapsed - 1.0),  # rough: minus relay and ~1 busy client core
        "load": load_avg(),
        "node_stderr": r.stderr[-400:],
    })
    return res


def run_sizes(args, results: dict) -> None:
    for n in args.sizes:
        jsonl, items = stored_set(n)
        db, info = ours_db(n, jsonl, items)
        results["stores"][f"ours-{n}"] = info
        srv = common.ours(db=db)
        srv.env.update(args.ours_env)
        srv.start(ready_timeout=300)
        try:
            for d in args.diffs:
                items_bin, have, need = client_side(items, d, args.seed)
                reps = args.reps if n <= 100_000 else args.big_reps
                for rep in range(reps):
                    log(f"ours n={n:,} diff={d:.0%} rep {rep + 1}/{reps} ...")
                    res = reconcile(srv, items_bin, args.frame, have, need, args.timeout)
                    res.update({"relay": "ours", "n": n, "diff": d, "rep": rep})
                    results["runs"].append(res)
                    log("  " + brief(res))
                items_bin.unlink(missing_ok=True)
        finally:
            srv.stop()
            for suffix in ("-wal", "-shm"):
                Path(str(db) + suffix).unlink(missing_ok=True)


def run_floor(args, results: dict) -> None:
    """The nostr-tools client against nostr-tools' responder in one process (see the module docstring)."""
    for n in args.floor_sizes:
        _, items = stored_set(n)
        relay_bin = items_file(items, NEG / f"relay-{n}.bin")
        for d in args.diffs:
            client_bin, have, need = client_side(items, d, args.seed)
            for rep in range(args.reps):
                out = NEG / "floor-out.json"
                r = subprocess.run(["node", "--no-warnings", str(FLOOR), str(client_bin), str(relay_bin),
                                    str(args.frame), "500000", str(out)], cwd=JS, capture_output=True,
                                   text=True, timeout=args.timeout)
                if r.returncode != 0:
                    raise RuntimeError(f"neg_inprocess.mjs exited {r.returncode}: {r.stderr[-800:]}")
                res = json.loads(out.read_text())
                out.unlink()
                exact = set(res.pop("have")) == have and set(res.pop("need")) == need
                res.update({"n": n, "diff": d, "rep": rep, "exact": exact, "load": load_avg()})
                results["floor"].append(res)
                log(f"floor n={n:,} diff={d:.0%} rep {rep + 1}: wall {res['wall_ms']:.0f} ms, initiator "
                    f"{res['initiator_ms']:.0f} ms, responder {res['responder_ms']:.0f} ms, "
                    f"{res['rounds']} rounds, {'exact' if exact else 'MISMATCH'}")
            client_bin.unlink(missing_ok=True)
        relay_bin.unlink(missing_ok=True)


def run_localrelay(args, results: dict) -> None:
    n = args.localrelay_n
    jsonl, items = stored_set(n)
    lines = [ln.rstrip(b"\n") for ln in open(jsonl, "rb")]
    db, info = ours_db(n, jsonl, items)
    results["stores"][f"ours-{n}"] = info
    targets = []
    if common.refs_installed()["localrelay"]:
        lr = common.localrelay()
        lr.start()
        t0 = time.perf_counter()
        log(f"localrelay: publishing {n:,} events")
        load = stores.publish(lr, lines, "localrelay")
        results["stores"][f"localrelay-{n}"] = {"publish_s": time.perf_counter() - t0,
                                                "acked": load.get("acked")}
        targets.append(("localrelay", lr))
    else:
        log("localrelay: bench/.venv-localrelay missing (bash bench/setup_refs.sh); skipped")
    srv = common.ours(db=db)
    srv.env.update(args.ours_env)
    srv.start(ready_timeout=300)
    targets.insert(0, ("ours", srv))
    try:
        for d in args.diffs:
            items_bin, have, need = client_side(items, d, args.seed)
            for rep in range(args.reps):
                for name, s in targets:  # interleaved, so both see the same machine load
                    log(f"{name} n={n:,} diff={d:.0%} rep {rep + 1}/{args.reps} ...")
                    try:
                        res = reconcile(s, items_bin, args.frame, have, need, args.timeout)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        res = {"errors": [f"{type(exc).__name__}: {exc}"]}
                    res.update({"relay": name, "n": n, "diff": d, "rep": rep, "pair": True})
                    results["runs"].append(res)
                    log("  " + brief(res))
            items_bin.unlink(missing_ok=True)
    finally:
        for _, s in targets:
            s.stop()
        for suffix in ("-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)


def run_ingest(args, results: dict) -> None:
    n = args.ingest_n
    jsonl, _ = stored_set(n)
    out = []
    for rep in range(args.ingest_reps):
        for enabled in (True, False):
            db = NEG / f"ingest-{'on' if enabled else 'off'}.db"
            log(f"ingest: relay import {n:,} events, negentropy {'on' if enabled else 'off'} "
                f"(rep {rep + 1}/{args.ingest_reps})")
            r = run_import(jsonl, db, enabled)
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                r["neg_items"] = con.execute("SELECT coalesce(sum(count), 0) FROM neg_nodes WHERE level = 1"
                                             ).fetchone()[0]
            r.update({"enabled": enabled, "n": n, "rep": rep, "eps": n / r["wall_s"],
                      "cpu_us_per_event": r["cpu_s"] / n * 1e6})
            out.append(r)
            log(f"  {r['eps']:,.0f} ev/s, {r['cpu_us_per_event']:.0f} µs CPU/ev, "
                f"neg_items {r['neg_items']:,}, load {r['load']}")
            for suffix in ("", "-wal", "-shm"):
                Path(str(db) + suffix).unlink(missing_ok=True)
    results["ingest"] = out


# ---------------------------------------------------------------- report
def brief(r: dict) -> str:
    if "wall_ms" not in r:
        return f"FAILED: {r.get('errors')}"
    ok = "exact" if r["have_exact"] and r["need_exact"] else "MISMATCH"
    return (f"{r['wall_ms'] / 1000:.3f}s wall, {r['round_trips']} rounds, up {r['up_bytes']:,} B, "
            f"down {r['down_bytes']:,} B, relay CPU {r['relay_cpu_rounds_s']:.2f}s, "
            f"client {r['client_ms'] / 1000:.2f}s, have {r['have']:,} need {r['need']:,} {ok}"
            + (f", errors {r['errors']}" if r.get("errors") else "") + f", load {r['load']}")


def report(results: dict) -> str:
    lines = [f"# NIP-77 reconciliation, nostr-tools client, frame {results['frame']:,} B, "
             f"our relay's env {results['args'].get('ours_env') or 'default (frame_size_limit 500,000)'} "
             f"({results['started']}, {os.cpu_count()} cores)",
             "",
             "| relay | n | diff | rep | wall s | rounds | up B | down B | relay CPU s (rounds) "
             "| relay CPU/round ms | client s | build s | have/need (expected) | load 1/5/15 |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |"]
    for r in results["runs"]:
        if "wall_ms" not in r:
            lines.append(f"| {r['relay']} | {r['n']:,} | {r['diff']:.0%} | {r['rep'] + 1} | FAILED: "
                         f"{'; '.join(r.get('errors', []))[:200]} |")
            continue
        per = ", ".join(f"{x['relay_cpu_s'] * 1000:.0f}" for x in r["rounds"])
        ok = "exact" if r["have_exact"] and r["need_exact"] else "**MISMATCH**"
        lines.append(
            f"| {r['relay']} | {r['n']:,} | {r['diff']:.0%} | {r['rep'] + 1} | {r['wall_ms'] / 1000:.3f} "
            f"| {r['round_trips']} | {r['up_bytes']:,} | {r['down_bytes']:,} "
            f"| {r['relay_cpu_rounds_s']:.2f} | {per} | {r['client_ms'] / 1000:.2f} "
            f"| {r['build_ms'] / 1000:.2f} | {r['have']:,}/{r['need']:,} "
            f"({r['expected_have']:,}/{r['expected_need']:,}) {ok} | {r['load']} |")
    pairs = [r for r in results["runs"] if r.get("pair") and "wall_ms" in r]
    if pairs:
        lines += ["", "LocalRelay comparison (same set, interleaved runs; median over reps; "
                  "ratio = ours / LocalRelay):", ""]
        for d in sorted({r["diff"] for r in pairs}):
            def med(relay, key):
                v = [r[key] for r in pairs if r["relay"] == relay and r["diff"] == d]
                return statistics.median(v) if v else float("nan")
            for key, label in (("wall_ms", "wall ms"), ("relay_cpu_rounds_s", "relay CPU s"),
                               ("round_trips", "rounds"), ("down_bytes", "down B"),
                               ("up_bytes", "up B")):
                a, b = med("ours", key), med("localrelay", key)
                lines.append(f"  diff {d:.0%} {label}: ours {a:,.3f}  localrelay {b:,.3f}  "
                             f"ratio {a / b if b else float('nan'):.2f}")
    if results.get("floor"):
        lines += ["", "Client floor: nostr-tools initiator against nostr-tools' responder in one process"
                  " (no socket, no relay; ms):", ""]
        for r in results["floor"]:
            lines.append(f"  n {r['n']:,} diff {r['diff']:.0%} rep {r['rep'] + 1}: wall {r['wall_ms']:,.0f}, "
                         f"initiator {r['initiator_ms']:,.0f}, responder {r['responder_ms']:,.0f}, "
                         f"{r['rounds']} rounds, {'exact' if r['exact'] else 'MISMATCH'}, load {r['load']}")
    if results.get("ingest"):
        lines += ["", "Ingest, relay import into a fresh db:", ""]
        for r in results["ingest"]:
            lines.append(f"  negentropy {'on ' if r['enabled'] else 'off'} rep {r['rep'] + 1}: "
                         f"{r['eps']:,.0f} ev/s, {r['cpu_us_per_event']:.0f} µs CPU/ev, "
                         f"neg_items {r['neg_items']:,}, load {r['load']}")
        on = [r for r in results["ingest"] if r["enabled"]]
        off = [r for r in results["ingest"] if not r["enabled"]]
        if on and off:
            eon = statistics.median(r["eps"] for r in on)
            eoff = statistics.median(r["eps"] for r in off)
            con = statistics.median(r["cpu_us_per_event"] for r in on)
            coff = statistics.median(r["cpu_us_per_event"] for r in off)
            lines.append(f"  median on/off throughput ratio {eon / eoff:.3f} "
                         f"(index costs {(1 - eon / eoff) * 100:.1f}% of throughput); "
                         f"CPU/ev on/off {con / coff:.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--diffs", type=float, nargs="+", default=[0.01, 0.1])
    ap.add_argument("--frame", type=int, default=60_000)
    ap.add_argument("--reps", type=int, default=3, help="repetitions for n <= 100,000")
    ap.add_argument("--big-reps", type=int, default=1, help="repetitions for n > 100,000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--localrelay-n", type=int, default=50_000)
    ap.add_argument("--skip-localrelay", action="store_true")
    ap.add_argument("--ingest-n", type=int, default=100_000)
    ap.add_argument("--ingest-reps", type=int, default=2)
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--floor-sizes", type=int, nargs="*", default=[100_000],
                    help="sizes of the in-process client floor runs (none: skip them)")
    ap.add_argument("--ours-env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="environment for our relay, e.g. RELAY_NEGENTROPY__FRAME_SIZE_LIMIT=60000")
    ap.add_argument("--report", type=Path, help="reprint the tables of a saved run")
    args = ap.parse_args()
    args.ours_env = dict(kv.split("=", 1) for kv in args.ours_env)
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return
    if not (JS / "node_modules" / "nostr-tools").is_dir():
        sys.exit("cd bench/js && npm install   (nostr-tools for the client)")
    ok, why = common.ours_available()
    if not ok:
        sys.exit(why)
    NEG.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "frame": args.frame,
               "args": vars(args) | {"report": None}, "stores": {}, "runs": [], "floor": [], "ingest": [],
               "uptime_start": load_avg()}
    path = common.RESULTS / f"negentropy-{stamp}.json"

    def save():
        results["uptime_end"] = load_avg()
        path.write_text(json.dumps(results, indent=1, default=str))

    try:
        if not args.skip_localrelay:
            run_localrelay(args, results)
            save()
        run_sizes(args, results)
        save()
        run_floor(args, results)
        save()
        if not args.skip_ingest:
            run_ingest(args, results)
    finally:
        save()
        print(report(results))
        print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
