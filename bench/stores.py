"""Start a relay that holds the first n bench events (seed 1), loading it the cheapest fair way.

- ours: `relay import FILE.jsonl --db PATH` (timed), then `relay serve` on that db;
  falls back to publishing if import is missing or fails.
- nostr-relay: loading 100k events takes many minutes (~300 events/s at first, slower as
  the store grows), so the store is built once with its own `nostr-relay load FILE` and the
  SQLite file cached in bench/results/cache/ (keyed by the events file and n); later runs
  start from a copy.
- localrelay: in-memory, so it is loaded by publishing every time.
Publishing uses ingest.run_ingest with 4 connections and a 1,000 window.
"""
from __future__ import annotations

import shutil
import subprocess
import time

import common
import events
import ingest

CACHE = common.RESULTS / "cache"


# nostr-relay reads one message at a time; with 1,000 queued EVENTs per connection and
# ~50 events/s per connection on a growing store, its pong answer waits behind them longer
# than uvicorn's 20 s ping timeout and it drops the connection.  Loading uses a small window.
LOAD_WINDOW = {"nostr-relay": 50}


def publish(srv: common.Server, lines: list[bytes], relay: str) -> dict:
    return publish_to(srv.url, srv.pid, lines, relay)


def publish_to(url: str, relay_pid: int | None, lines: list[bytes], relay: str = "") -> dict:
    """Publish every line as an EVENT to the relay at `url` (4 connections; `relay` names a relay
    with quirks below, "" for any other); ingest.run_ingest's result.  RuntimeError unless all are answered."""
    r = ingest.run_ingest(url, lines, 4, LOAD_WINDOW.get(relay, 1000), relay_pid,
                          duration=1800, grace=120,
                          reconnect_every=ingest.RECONNECT_EVERY.get(relay, 0))
    if r["errors"] or r["acked"] < len(lines):
        raise RuntimeError(f"loading {relay or url} failed: {ingest.fmt(r)}")
    return r


def start_loaded(relay: str, n: int, log=common.eprint) -> tuple[common.Server, dict]:
    lines = events.load(n)
    info: dict = {"relay": relay, "n": n}
    if relay == "ours":
        src = events.exact_file(n)
        srv = common.ours()
        db = srv.cwd / "relay.db"
        t0 = time.perf_counter()
        try:
            r = subprocess.run([str(common.REPO / ".venv" / "bin" / "relay"), "import", "--create", str(src),
                                "--db", str(db)], cwd=common.REPO, capture_output=True,
                               text=True, timeout=900)
            ok = r.returncode == 0
            info["import_s"] = time.perf_counter() - t0
            info["import_rc"] = r.returncode
            info["import_out"] = (r.stdout + r.stderr)[-800:]
        except subprocess.TimeoutExpired:
            ok = False
            info["import_rc"] = "timeout (900 s)"
        if ok:
            info["method"] = "relay import"
            info["import_eps"] = n / info["import_s"]
            log(f"ours: relay import of {n:,} events took {info['import_s']:.1f}s "
                f"({info['import_eps']:,.0f} ev/s)")
            return srv.start(), info
        log(f"ours: relay import failed ({info.get('import_rc')}): {info.get('import_out', '')}"
            f" -> publishing instead")
        if db.exists():
            db.unlink()
        srv.start()
        info["method"] = "publish"
        info["load"] = publish(srv, lines, relay)
        return srv, info
    if relay == "nostr-relay":
        CACHE.mkdir(parents=True, exist_ok=True)
        cached = CACHE / f"nostr-relay-1.14-{events.cache_path(n).stem}.sqlite3"
        if not cached.exists():
            # nostr-relay's own bulk path (`nostr-relay load FILE`: same add_event code as
            # a websocket EVENT, minus the socket), timed; run once, then cached.
            log(f"nostr-relay: no cached store; `nostr-relay load` of {n:,} events once "
                f"(several minutes), then caching {cached.name}")
            srv = common.nostr_relay()
            cfg = srv.cwd / "config.yaml"
            db = srv.cwd / "nostr.sqlite3"
            exe = common.BENCH / ".venv-nostr-relay" / "bin" / "nostr-relay"
            # create the schema the way `serve` does (alembic upgrade), then load
            srv.cleanup = False  # the store is built in its directory, copied, then removed
            srv.start()
            srv.stop(grace=30)
            t0 = time.perf_counter()
            r = subprocess.run([str(exe), "-c", str(cfg), "load", str(events.exact_file(n))],
                               cwd=srv.cwd, capture_output=True, text=True, timeout=3600)
            info["load_s"] = time.perf_counter() - t0
            info["load_tail"] = (r.stdout + r.stderr)[-600:]
            if r.returncode != 0:
                raise RuntimeError(f"nostr-relay load failed ({r.returncode}): {info['load_tail']}")
            log(f"nostr-relay load: {n:,} events in {info['load_s']:.0f}s "
                f"({n / info['load_s']:,.0f} ev/s)")
            import sqlite3
            con = sqlite3.connect(db)
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            con.close()
            tmp = cached.with_suffix(".tmp")
            shutil.copyfile(db, tmp)
            tmp.rename(cached)
            (cached.with_suffix(".log")).write_text(
                f"load_s={info['load_s']:.1f}\n{info['load_tail']}\n")
            shutil.rmtree(srv.cwd, ignore_errors=True)
        info["method"] = f"copy of cached store {cached.name}"
        return common.nostr_relay(seed_db=cached).start(), info
    if relay == "localrelay":
        srv = common.localrelay().start()
        info["method"] = "publish"
        info["load"] = publish(srv, lines, relay)
        return srv, info
    raise ValueError(relay)
