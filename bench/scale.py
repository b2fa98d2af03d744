"""A million events and more: ours and strfry on the same generated file, one run, side by side.

    nice -n 10 .venv/bin/python bench/scale.py --n 1000000 \\
        --strfry /opt/strfry/strfry --strfry-config /opt/strfry/bench.conf
    .venv/bin/python bench/scale.py --n 20000                       # ours only, a smoke run
    .venv/bin/python bench/scale.py --events FILE.jsonl ...          # any JSONL file of signed events

1. Events: bench/events.py's scale mix (20,000 authors, a year of kinds 0/1/3/6/7/30023), generated to
   bench/results/events-scale-*.jsonl a chunk at a time (cached); the query targets and the expected answers
   are found by reading that file twice, a line at a time (query.StreamedModel), never holding it.
2. Import: `relay import FILE --db NEW` (our default configuration: projectors, search, negentropy index,
   change feed), and `strfry --config COPY import < FILE` into a new db directory (COPY: --strfry-config with
   `db`, `bind`, `port` and `nofiles` rewritten).  Wall time, CPU (utime+stime of the process and its children) and
   bytes written (`write_bytes` of /proc/PID/io; at exit, from the kernel's rusage, which counts the same).
3. Disk: ours after `PRAGMA wal_checkpoint(TRUNCATE)`: apparent and allocated (st_blocks * 512) size of
   every file, and each table and index from SQLite's `dbstat`; strfry: every file of its db directory, and
   data.mdb (sparse) before and after `strfry compact`.
4. Queries: both relays started (`relay serve` with its default workers; `strfry relay`); their files
   evicted from the page cache (fsync, posix_fadvise DONTNEED; resident bytes by fincore) before they start
   and again before the first round; query.py's shapes (author feed, kind+since, thread, mentions, ids1,
   ids100, COUNT kind 1, COUNT #p), each on its own connection: a cold round (no warm-up; `first` is the
   first, cold, answer; every first answer checked against the file), then --rounds warm rounds, ours and
   strfry alternating (the order swapped each round); warm p50/p99 = the median over rounds of each round's
   p50/p99.  PSS (/proc/PID/smaps_rollup, summed over each relay's processes) idle after start, its peak
   during that relay's warm rounds (sampled every 0.5 s), and idle at the end.
5. Under load: overload.loaded_phase on each in turn: one connection publishes --load-rate fresh kind-1
   events/s (events.scale_live_file: other authors, no tags, dated after the year) while the REQ shapes run
   again (--load-reps each); p50/p99, and the relay's write_bytes per event accepted.
Prints the table (ours / strfry beside each figure) and writes bench/results/scale-<stamp>.json.  Stores
go in bench/results/run/scale-<stamp>/, removed at the end (--keep keeps them).  Loopback only; the relays
are started here and stopped by their own process group; every loop is bounded in count and time.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import events  # noqa: E402
import overload  # noqa: E402
import query  # noqa: E402
import side_by_side  # noqa: E402

MB = 1e6


def log(*a) -> None:
    common.eprint(time.strftime("%H:%M:%S"), *a)


# ---------------------------------------------------------------- /proc and the page cache
def pss(pid: int) -> dict:
    """Pss, Pss_Anon and Pss_File (MB) of /proc/P/smaps_rollup summed over pid's process tree."""
    out = {"pss_mb": 0.0, "pss_anon_mb": 0.0, "pss_file_mb": 0.0}
    names = {"Pss:": "pss_mb", "Pss_Anon:": "pss_anon_mb", "Pss_File:": "pss_file_mb"}
    for p in common.tree_pids(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    parts = line.split()
                    if parts and parts[0] in names:
                        out[names[parts[0]]] += int(parts[1]) * 1024 / MB
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return out


class PeakPss:
    """The largest summed PSS of a process tree, sampled every `interval` seconds by a thread while in `with`."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval, self.peak = pid, interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = pss(self.pid)
            if now["pss_mb"] > self.peak.get("pss_mb", -1.0):
                self.peak = now
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def write_bytes(pid: int) -> int:
    """`write_bytes` of /proc/P/io summed over pid's process tree (bytes this tree caused to be written)."""
    total = 0
    for p in common.tree_pids(pid):
        try:
            with open(f"/proc/{p}/io") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("write_bytes:"))
        except (FileNotFoundError, ProcessLookupError, PermissionError, StopIteration):
            pass
    return total


def files_of(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def resident_bytes(paths: list[Path]) -> int | None:
    """Bytes of `paths` in the page cache (util-linux fincore), None without fincore."""
    if not shutil.which("fincore") or not paths:
        return None
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                       capture_output=True, text=True, timeout=60)
    return sum(int(x) for x in r.stdout.split() if x.isdigit()) if r.returncode == 0 else None


def evict(paths: list[Path]) -> dict:
    """Write back, then drop from the page cache, every file of `paths` (pages a process maps stay)."""
    before = resident_bytes(paths)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return {"resident_before_mb": before / MB if before is not None else None,
            "resident_after_mb": (after / MB) if (after := resident_bytes(paths)) is not None else None}


# ---------------------------------------------------------------- import
def timed_import(name: str, cmd: list[str], stdin: Path | None, cwd: Path, n: int, timeout: float) -> dict:
    """Run one import to its end (killed past `timeout` s): wall, CPU and bytes written of it and its children."""
    log_path = cwd / f"{name}-import.log"
    busy0, t0 = common.system_busy(), time.perf_counter()
    with open(log_path, "wb") as out, open(stdin or os.devnull, "rb") as inp:
        proc = subprocess.Popen(cmd, cwd=cwd, stdin=inp, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    status, usage, last_io = None, None, 0
    while time.perf_counter() - t0 < timeout:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        last_io = write_bytes(proc.pid) or last_io
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    wall = time.perf_counter() - t0
    tail = log_path.read_text(errors="replace")[-1500:]
    if proc.returncode != 0:
        raise RuntimeError(f"{name} import exited {proc.returncode} after {wall:.0f}s; {log_path}:\n{tail}")
    written = usage.ru_oublock * 512  # Linux: the task's write_bytes >> 9, its threads and children included
    cpu = usage.ru_utime + usage.ru_stime
    r = {"events": n, "seconds": wall, "events_per_s": n / wall, "cpu_s": cpu, "cpu_us_per_event": cpu / n * 1e6,
         "write_bytes": written, "write_bytes_per_event": written / n, "write_bytes_last_sample": last_io,
         "max_rss_mb": usage.ru_maxrss * 1024 / MB, "other_cores": (common.system_busy() - busy0 - cpu) / wall,
         "output_tail": tail[-600:]}
    log(f"{name} import: {n:,} events in {wall:,.1f}s ({r['events_per_s']:,.0f}/s), CPU {cpu:,.1f}s, "
        f"written {written / MB:,.0f} MB ({r['write_bytes_per_event']:,.0f} B/event)")
    return r


# ---------------------------------------------------------------- disk
def sizes(directory: Path) -> dict:
    """Apparent and allocated (st_blocks * 512) bytes of every file under `directory`, and their sums."""
    files = {}
    for p in files_of(directory):
        st = p.stat()
        files[str(p.relative_to(directory))] = {"apparent": st.st_size, "allocated": st.st_blocks * 512}
    return {"files": files, "apparent": sum(f["apparent"] for f in files.values()),
            "allocated": sum(f["allocated"] for f in files.values())}


def sqlite_disk(db: Path) -> dict:
    """`wal_checkpoint(TRUNCATE)`, then the files' sizes and each b-tree's bytes from `dbstat` (pages, payload,
    unused), with the table it belongs to; freelist pages apart."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        owner = {name: (typ, tbl) for typ, name, tbl in con.execute("SELECT type, name, tbl_name FROM sqlite_schema")}
        try:
            rows = con.execute("SELECT name, count(*), sum(pgsize), sum(payload), sum(unused) FROM dbstat "
                               "GROUP BY name ORDER BY 3 DESC").fetchall()
        except sqlite3.OperationalError as exc:  # SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
            rows, dbstat_error = [], f"dbstat unavailable ({exc}): see sqlite3_analyzer (Debian sqlite3-tools)"
        else:
            dbstat_error = None
    finally:
        con.close()
    btrees = [{"name": name, "type": owner.get(name, ("table", name))[0], "table": owner.get(name, ("", name))[1],
               "pages": n, "bytes": size, "payload": payload, "unused": unused}
              for name, n, size, payload, unused in rows]
    per_table: dict[str, int] = {}
    for b in btrees:
        per_table[b["table"]] = per_table.get(b["table"], 0) + b["bytes"]
    return {**sizes(db.parent), "page_size": page_size, "pages": pages, "freelist_bytes": free * page_size,
            "btrees": btrees, "per_table": dict(sorted(per_table.items(), key=lambda kv: -kv[1])),
            "dbstat_error": dbstat_error}


def strfry_disk(strfry: str, config: Path, db_dir: Path) -> dict:
    """Every file of strfry's db directory, then data.mdb's copy made by `strfry compact` (removed after)."""
    out = sizes(db_dir)
    compacted = db_dir.parent / "compacted.mdb"
    t0 = time.perf_counter()
    r = subprocess.run([strfry, "--config", str(config), "compact", str(compacted)], capture_output=True,
                       text=True, timeout=3600, cwd=db_dir.parent)
    if r.returncode != 0 or not compacted.exists():
        out["compact_error"] = f"exit {r.returncode}: {(r.stdout + r.stderr)[-500:]}"
    else:
        st = compacted.stat()
        out["compacted"] = {"apparent": st.st_size, "allocated": st.st_blocks * 512,
                            "seconds": time.perf_counter() - t0}
        compacted.unlink()
    return out


# ---------------------------------------------------------------- relays
def strfry_config(template: Path, out: Path, db_dir: Path, port: int) -> Path:
    """A copy of strfry's config with `db` set to db_dir, `bind` to loopback, `port` to port and `nofiles` to 0."""
    text, n = re.subn(r'(?m)^(\s*)db\s*=.*$', lambda m: f'{m.group(1)}db = "{db_dir}/"', template.read_text())
    if not n:
        raise SystemExit(f"{template}: no `db = ...` line to point at a fresh directory")
    text = re.sub(r'(?m)^(\s*)bind\s*=.*$', lambda m: f'{m.group(1)}bind = "{common.HOST}"', text)
    text = re.sub(r'(?m)^(\s*)port\s*=\s*\d+', lambda m: f"{m.group(1)}port = {port}", text)
    # as in "Side by side with strfry": leave the open-files limit as it is (its default 524288 fails where the
    # hard limit is lower)
    text = re.sub(r'(?m)^(\s*)nofiles\s*=\s*\d+', lambda m: f"{m.group(1)}nofiles = 0", text)
    out.write_text(text)
    return out


def queries(url: str, model: query.StreamedModel, reps: int, warmup: int, check: bool) -> dict[str, dict]:
    rows = asyncio.run(query.bench_queries(url, model.targets, None, reps, warmup=warmup,
                                           expect=model.expect if check else None))
    return {r["query"]: r for r in rows}


def median_rounds(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """shape -> the median over rounds of each round's p50 and p99 (ms)."""
    out: dict[str, dict] = {}
    for shape in rounds[0] if rounds else {}:
        got = [r[shape] for r in rounds if "p50_ms" in r.get(shape, {})]
        if got:
            out[shape] = {"p50_ms": statistics.median(g["p50_ms"] for g in got),
                          "p99_ms": statistics.median(g["p99_ms"] for g in got), "rounds": len(got)}
    return out


def _start(relays: dict[str, tuple[common.Server, Path]], res: dict, args) -> None:
    """Evict each relay's files, start it, wait 3 s: its PSS idle; evict again (what it read while starting)."""
    for name, (srv, directory) in relays.items():
        res[name]["evicted_before_start"] = evict(files_of(directory))
        t0 = time.perf_counter()
        srv.start(ready_timeout=args.start_timeout)
        res[name]["start_s"] = time.perf_counter() - t0
        log(f"{name}: {srv.url}, pid {srv.pid}, {len(common.tree_pids(srv.pid))} processes, "
            f"ready in {res[name]['start_s']:.1f}s")
    time.sleep(3.0)
    for name, (srv, directory) in relays.items():
        res[name]["pss_idle"] = pss(srv.pid)
        res[name]["evicted"] = evict(files_of(directory))


def _rounds(relays: dict[str, tuple[common.Server, Path]], res: dict, model, args) -> None:
    """The cold round on each relay, then the warm rounds, alternating, with each relay's peak PSS during its own."""
    for name, (srv, _) in relays.items():
        res[name]["cold"] = cold = queries(srv.url, model, args.round_reps, 0, check=True)
        log(f"{name} cold, first answers (ms): "
            + ", ".join(f"{k} {v.get('first_ms', float('nan')):.1f}" for k, v in cold.items()))
    order = list(relays)
    for name in order:
        res[name]["rounds"] = []
    for i in range(args.rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            srv = relays[name][0]
            with PeakPss(srv.pid) as peak:
                res[name]["rounds"].append(queries(srv.url, model, args.round_reps, 1, check=False))
            if peak.peak.get("pss_mb", 0) > res[name].get("pss_queries", {}).get("pss_mb", -1):
                res[name]["pss_queries"] = peak.peak
        log(f"warm round {i + 1}/{args.rounds} done")
    for name in order:
        res[name]["warm"] = median_rounds(res[name]["rounds"])


def _loaded(name: str, srv: common.Server, model, live: list[bytes], args) -> dict:
    """overload.loaded_phase on one relay, with its process tree's write_bytes per event accepted."""
    w0 = write_bytes(srv.pid)
    phase = overload.loaded_phase(srv.url, srv.pid, model.targets, live, args.load_rate, args.load_reps)
    accepted = phase["paced"]["ok_true"]
    phase["write_bytes"] = write_bytes(srv.pid) - w0
    phase["write_bytes_per_event"] = phase["write_bytes"] / accepted if accepted else None
    log(overload.fmt_phase(name, phase).strip())
    return phase


def serve_and_query(relays: dict[str, tuple[common.Server, Path]], model, live: list[bytes], args) -> dict:
    """Steps 4 and 5 of the docstring on `relays` (name -> (its server, not started; the directory of its files));
    name -> results.  A failed step ends the steps (its error in the results); the relays are stopped."""
    res: dict = {name: {} for name in relays}
    try:
        _start(relays, res, args)
        common.install_uvloop()
        _rounds(relays, res, model, args)
        for name, (srv, _) in relays.items():
            if live:
                res[name]["loaded"] = _loaded(name, srv, model, live, args)
        time.sleep(2.0)
        for name, (srv, _) in relays.items():
            res[name]["pss_end"] = pss(srv.pid)
    except Exception as exc:
        log(f"serving and querying: FAILED {exc!r}")
        res["error"] = repr(exc)
    finally:
        for srv, _ in relays.values():
            srv.stop()
    return res


# ---------------------------------------------------------------- report
def _row(label: str, a, b, fmt: str) -> str:
    def cell(v):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"
    ratio = f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"
    return f"{label:<40}{cell(a):>12}{cell(b):>12}{ratio:>12}"


def _get(d: dict, keys: tuple[str, ...], scale: float = 1.0):
    """d[k0][k1]... / scale, None where a key is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d / scale if isinstance(d, (int, float)) else None


def report(rep: dict) -> str:
    o, s = rep["ours"], rep.get("strfry", {})
    ev = rep["events"]
    L = [f"== Scale: {ev['n']:,} events ({ev['bytes'] / MB:,.0f} MB of JSONL), ours and strfry ==",
         f"{'':<40}{'ours':>12}{'strfry':>12}{'ours/strfry':>12}"]
    n = ev["n"]
    for label, keys, scale, fmt in (
            ("import, events/s", ("import", "events_per_s"), 1, ",.0f"),
            ("  CPU-s", ("import", "cpu_s"), 1, ",.1f"),
            ("  CPU µs per event", ("import", "cpu_us_per_event"), 1, ",.0f"),
            ("  bytes written per event", ("import", "write_bytes_per_event"), 1, ",.0f"),
            ("disk, allocated MB", ("disk", "allocated"), MB, ",.1f"),
            ("  apparent MB", ("disk", "apparent"), MB, ",.1f"),
            ("  data.mdb after strfry compact, MB", ("disk", "compacted", "allocated"), MB, ",.1f"),
            ("  allocated bytes per event", ("disk", "allocated"), n, ",.0f")):
        L.append(_row(label, _get(o, keys, scale), _get(s, keys, scale), fmt))
    shapes = list(o.get("cold", {}))
    for title, key in (("cold (first round after eviction), ms", "cold"), ("warm (median of rounds), ms", "warm"),
                       (f"under {rep['args']['load_rate']:,.0f} events/s of publishing, ms", "loaded")):
        L.append(title + ":")
        a_all = o.get(key, {}) if key != "loaded" else o.get("loaded", {}).get("loaded", {})
        b_all = s.get(key, {}) if key != "loaded" else s.get("loaded", {}).get("loaded", {})
        for shape in shapes:
            a, b = a_all.get(shape, {}), b_all.get(shape, {})
            if not a and not b:
                continue
            if key == "cold":
                L.append(_row(f"  {shape} first", a.get("first_ms"), b.get("first_ms"), ".2f"))
            for pct in ("p50", "p99"):
                L.append(_row(f"  {shape} {pct}", a.get(f"{pct}_ms"), b.get(f"{pct}_ms"), ".2f"))
            for name, q in (("ours", a), ("strfry", b)):
                if q.get("match") is False or q.get("errors"):
                    L.append(f"    {name}: returned {q.get('returned')} expected {q.get('expected')} "
                             f"errors {q.get('errors')}")
    ol, sl = o.get("loaded", {}), s.get("loaded", {})
    for name, x in (("ours", ol), ("strfry", sl)):
        if x:
            L.append(overload.fmt_phase(name, x))
    L.append(_row("  bytes written per event published", ol.get("write_bytes_per_event"),
                  sl.get("write_bytes_per_event"), ",.0f"))
    for label, key in (("PSS idle after start, MB", "pss_idle"), ("PSS peak during warm rounds, MB", "pss_queries"),
                       ("PSS idle at the end, MB", "pss_end")):
        L.append(_row(label, o.get(key, {}).get("pss_mb"), s.get(key, {}).get("pss_mb"), ",.1f"))
        L.append(_row("  of it anonymous", o.get(key, {}).get("pss_anon_mb"), s.get(key, {}).get("pss_anon_mb"),
                      ",.1f"))
    for name, x in (("ours", o), ("strfry", s)):
        ev = x.get("evicted", {})
        if ev.get("resident_after_mb") is not None:
            L.append(f"  {name}: files resident after the eviction before the cold round: "
                     f"{ev['resident_after_mb']:,.1f} MB (before: {ev['resident_before_mb']:,.1f} MB)")
    for name, x in (("", rep), ("strfry: ", s)):
        if x.get("error"):
            L.append(f"FAILED: {name}{x['error']}")
    od = o.get("disk", {})
    if od.get("btrees"):
        L.append(f"ours, largest b-trees (dbstat; {od['page_size']} B pages; freelist "
                 f"{od['freelist_bytes'] / MB:,.1f} MB):")
        for b in od["btrees"][:rep["args"]["top"]]:
            L.append(f"  {b['name']:<44}{b['type']:<7}{b['bytes'] / MB:>10,.1f} MB {b['bytes'] / n:>7,.0f} B/event"
                     f"  {b['unused'] / max(b['bytes'], 1):>4.0%} unused")
    elif od.get("dbstat_error"):
        L.append(f"ours: {od['dbstat_error']}")
    return "\n".join(L)


# ---------------------------------------------------------------- main
def strfry_import(args, path: Path, n: int, run_dir: Path) -> dict:
    """strfry's import into a new db directory, and its disk; "server": (its relay, not started; the directory)."""
    sdir = run_dir / "strfry"
    (sdir / "db").mkdir(parents=True)
    port = common.free_port()
    cfg = strfry_config(args.strfry_config, sdir / "strfry.conf", sdir / "db", port)
    out = {"import": timed_import("strfry", [args.strfry, "--config", str(cfg), "import"], path, sdir, n,
                                  args.import_timeout)}
    out["disk"] = d = strfry_disk(args.strfry, cfg, sdir / "db")
    log(f"strfry disk: {d['allocated'] / MB:,.1f} MB allocated"
        + (f", {d['compacted']['allocated'] / MB:,.1f} MB compacted" if "compacted" in d else ""))
    out["server"] = (common.Server("strfry", [args.strfry, "--config", str(cfg), "relay"], port, sdir), sdir / "db")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="events generated (events.py --mix scale)")
    ap.add_argument("--authors", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--events", type=Path, help="a JSONL file of signed events to use instead (all its lines)")
    ap.add_argument("--strfry", help="strfry's binary; without it, ours only")
    ap.add_argument("--strfry-config", type=Path, help="strfry's config (copied: db, bind, port, nofiles rewritten)")
    ap.add_argument("--workers", type=int, default=None, help="ours: `relay serve --workers N` (default: its own)")
    ap.add_argument("--processes", type=int, default=None,
                    help="ours: `relay import --processes N` (default: its own, one per CPU; 0: one process)")
    ap.add_argument("--rounds", type=int, default=5, help="warm rounds per relay")
    ap.add_argument("--round-reps", type=int, default=20, help="repetitions of each shape per round")
    ap.add_argument("--load-rate", type=float, default=1650.0, help="events/s published in the loaded phase")
    ap.add_argument("--load-reps", type=int, default=50, help="repetitions of each REQ shape in the loaded phase")
    ap.add_argument("--fresh", type=int, default=200_000, help="fresh events available to the loaded phase "
                    "(0: skip it); it stops early if they run out")
    ap.add_argument("--import-timeout", type=float, default=4 * 3600.0, help="seconds an import may take")
    ap.add_argument("--start-timeout", type=float, default=600.0, help="seconds a relay may take to start")
    ap.add_argument("--top", type=int, default=10, help="b-trees listed in the table")
    ap.add_argument("--keep", action="store_true", help="keep the stores (bench/results/run/scale-<stamp>/)")
    args = ap.parse_args()
    if bool(args.strfry) != bool(args.strfry_config):
        ap.error("--strfry and --strfry-config go together")

    t0 = time.perf_counter()
    path = args.events or events.scale_file(args.n, args.seed, args.authors)
    model = query.StreamedModel(lambda: events.iter_lines(path))
    n = sum(model.kinds.values())
    t = model.targets
    log(f"{path}: {n:,} events, kinds {dict(sorted(model.kinds.items()))}; targets: author with "
        f"{t['author_events']} events, root with {t['root_refs']} replies, pubkey with {t['ptag_refs']} mentions "
        f"({time.perf_counter() - t0:.0f}s)")
    live = list(events.iter_lines(events.scale_live_file(args.fresh, args.seed))) if args.fresh else []
    rep: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                 "events": {"path": str(path), "n": n, "bytes": path.stat().st_size, "kinds": model.kinds},
                 "targets": {k: v for k, v in t.items() if k not in ("ids", "rng")}, "ours": {}}
    run_dir = common.RESULTS / "run" / f"scale-{time.strftime('%Y%m%d-%H%M%S')}"
    (run_dir / "ours").mkdir(parents=True)
    try:
        db = run_dir / "ours" / "relay.db"
        processes = [] if args.processes is None else ["--processes", str(args.processes)]
        rep["ours"]["import"] = timed_import("ours", [str(common.REPO / ".venv" / "bin" / "relay"), "import",
                                                      "--create", str(path), "--db", str(db), *processes], None,
                                             run_dir, n, args.import_timeout)
        rep["ours"]["disk"] = sqlite_disk(db)
        log(f"ours disk: {rep['ours']['disk']['allocated'] / MB:,.1f} MB allocated")
        relays = {"ours": (common.ours(db=db, workers=args.workers), db.parent)}
        if args.strfry:
            rep["strfry"] = side_by_side.attempt("strfry import", lambda: strfry_import(args, path, n, run_dir))
            if "error" not in rep["strfry"]:
                relays["strfry"] = rep["strfry"].pop("server")
        res = serve_and_query(relays, model, live, args)
        rep["error"] = res.pop("error", None)
        for name, result in res.items():
            rep[name].update(result)
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    rep["seconds"] = time.perf_counter() - t0
    rep["table"] = text = report(rep)
    print(text)
    common.write_results("scale", rep)


if __name__ == "__main__":
    main()
