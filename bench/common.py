"""Shared bits of the benchmark harness: starting/stopping relays, /proc accounting.

Every server is started by us with subprocess.Popen(start_new_session=True) and stopped
by its own PID / process group id (the group we created), SIGTERM then SIGKILL.
Everything binds and connects to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
PROJECT_PY = REPO / ".venv" / "bin" / "python"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- /proc accounting
def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the comm field may contain spaces; split after the closing parenthesis
    return data[data.rindex(")") + 2:].split()


def tree_pids(pid: int) -> list[int]:
    """pid and all its live descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            f = _stat_fields(int(d))
            if f:
                children.setdefault(int(f[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """utime+stime (fields 14, 15 of /proc/PID/stat) of pid (and descendants), in seconds."""
    tot = 0
    for p in (tree_pids(pid) if tree else [pid]):
        f = _stat_fields(p)
        if f:  # f[0] is field 3 (state); utime is field 14 -> index 11
            tot += int(f[11]) + int(f[12])
    return tot / CLK_TCK


def rss_bytes(pid: int, tree: bool = True, field: str = "VmRSS") -> int:
    """VmRSS (or another memory `field`, e.g. VmHWM) from /proc/PID/status (summed over the process tree)."""
    tot = 0
    for p in (tree_pids(pid) if tree else [pid]):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        tot += int(line.split()[1]) * 1024
                        break
        except FileNotFoundError:
            pass
    return tot


def rss_detail(pid: int, tree: bool = True) -> dict:
    """VmRSS and RssAnon (private anonymous memory; VmRSS also counts mmap'd file pages
    such as an SQLite database mapped with mmap_size) of the process tree, in MiB."""
    out = {"vmrss_mb": 0.0, "rssanon_mb": 0.0}
    for p in (tree_pids(pid) if tree else [pid]):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out["vmrss_mb"] += int(line.split()[1]) / 1024
                    elif line.startswith("RssAnon:"):
                        out["rssanon_mb"] += int(line.split()[1]) / 1024
        except FileNotFoundError:
            pass
    return out


def system_busy() -> float:
    """CPU-seconds all cores spent busy since boot (from /proc/stat), to spot other load."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / CLK_TCK


def thread_schedstat(pid: int, tid: int | None = None) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of thread `tid` of `pid` (its main thread by
    default), from /proc/PID/task/TID/schedstat; (0, 0) where the kernel keeps no scheduler statistics."""
    try:
        with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def raise_fd_limit() -> int:
    """Raise this process's open-files soft limit to its hard limit (many client sockets); the new limit."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# ---------------------------------------------------------------- servers
@dataclass
class Server:
    name: str
    cmd: list[str]
    port: int
    cwd: Path
    env: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    started: float = 0.0
    # remove the run directory (databases) on stop; logs stay in results/logs/.
    # BENCH_KEEP=1 keeps them for inspection.
    cleanup: bool = field(default_factory=lambda: os.environ.get("BENCH_KEEP") != "1")

    @property
    def url(self) -> str:
        return f"ws://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, ready_timeout: float = 60.0) -> "Server":
        logs = RESULTS / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"{self.name}-{self.port}.log"
        env = dict(os.environ)
        env.update(self.env)
        lf = open(self.log, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=env, stdout=lf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        lf.close()
        self.started = time.time()
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log {self.log}:\n{self.tail()}")
            if ws_ready(self.port):
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready on port {self.port} after "
                           f"{ready_timeout}s; log {self.log}:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except Exception:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        self._stop(grace)
        if self.cleanup and self.cwd.is_dir() and self.cwd.parent == RESULTS / "run":
            shutil.rmtree(self.cwd, ignore_errors=True)

    def _stop(self, grace: float) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        pgid = p.pid  # start_new_session: the group id is the pid we started
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # reap stragglers of our own group (e.g. gunicorn workers)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def ws_ready(port: int) -> bool:
    """True once a WebSocket upgrade on 127.0.0.1:port answers 101."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                      b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      b"Sec-WebSocket-Version: 13\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return b" 101 " in data.split(b"\r\n", 1)[0] + b" "
    except OSError:
        return False


def _rundir(name: str, port: int) -> Path:
    d = RESULTS / "run" / f"{name}-{port}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def ours_available() -> tuple[bool, str]:
    exe = REPO / ".venv" / "bin" / "relay"
    if not exe.exists():
        return False, f"{exe} missing (cd {REPO} && .venv/bin/pip install -e .)"
    try:
        r = subprocess.run([str(exe), "serve", "--help"], capture_output=True, text=True,
                           timeout=30, cwd=REPO)
    except subprocess.TimeoutExpired:
        return False, "relay serve --help timed out"
    if r.returncode != 0:
        return False, f"relay serve --help exited {r.returncode}: {(r.stderr or r.stdout)[-500:]}"
    return True, ""


@functools.lru_cache(maxsize=1)
def ours_has_workers() -> bool:
    """Whether this tree's `relay serve` takes --workers (issue 16's worker processes)."""
    r = subprocess.run([str(REPO / ".venv" / "bin" / "relay"), "serve", "--help"], capture_output=True,
                       text=True, timeout=30, cwd=REPO)
    return "--workers" in r.stdout


def workers_args(workers: int | None) -> list[str]:
    """`relay serve` arguments giving it `workers` worker processes (None: the relay's own default).

    Raises RuntimeError for workers > 0 on a relay without --workers; 0 there is its only mode."""
    if workers is None or (workers == 0 and not ours_has_workers()):
        return []
    if not ours_has_workers():
        raise RuntimeError(f"workers={workers}: this tree's `relay serve` has no --workers")
    return ["--workers", str(workers)]


def ours(port: int | None = None, db: Path | None = None, workers: int | None = None) -> Server:
    """`relay serve` on a fresh run directory (its database there unless `db`), rate limits off,
    with `workers` worker processes (None: the relay's default; see workers_args)."""
    port = port or free_port()
    d = _rundir("ours", port)
    db = db or d / "relay.db"
    # The load generators are one client IP: the shipped rate limits would measure themselves.
    return Server("ours", [str(REPO / ".venv" / "bin" / "relay"), "serve", "--host", HOST,
                           "--port", str(port), "--db", str(db), *workers_args(workers)], port, d,
                  env={"RELAY_RATE_LIMITS__ENABLED": "false"})


NOSTR_RELAY_CONFIG = """\
# generated by bench/common.py for one benchmark run
DEBUG: false
relay_name: bench nostr-relay
relay_description: reference relay for benchmarks
storage:
  sqlalchemy.url: sqlite+aiosqlite:///{db}
  num_concurrent_reqs: 10
  num_concurrent_adds: 2
  validators:
    - nostr_relay.validators.is_not_too_large
    - nostr_relay.validators.is_signed
    - nostr_relay.validators.is_recent
    - nostr_relay.validators.is_not_hellthread
verification:
  nip05_verification: disabled
gunicorn:
  bind: 127.0.0.1:{port}
  workers: 1
  loglevel: warning
  reload: false
authentication:
  enabled: false
message_timeout: 1800
subscription_limit: 100
max_limit: 6000
max_event_size: 65536
# the bench events are dated from 2026-08; the default (1 year) would reject them one day
oldest_event: 3153600000
hellthread_limit: 100
logging:
  version: 1
  root: {{level: WARNING}}
  loggers:
    nostr_relay: {{level: WARNING}}
"""


def nostr_relay(port: int | None = None, seed_db: Path | None = None) -> Server:
    """PyPI nostr-relay 1.14, default server (gunicorn + 1 uvicorn worker), SQLite.
    seed_db: start from a copy of this database file."""
    port = port or free_port()
    d = _rundir("nostr-relay", port)
    cfg = d / "config.yaml"
    db = d / "nostr.sqlite3"
    if seed_db is not None:
        shutil.copyfile(seed_db, db)
    cfg.write_text(NOSTR_RELAY_CONFIG.format(db=db, port=port))
    exe = BENCH / ".venv-nostr-relay" / "bin" / "nostr-relay"
    return Server("nostr-relay", [str(exe), "-c", str(cfg), "serve"], port, d)


def localrelay(port: int | None = None) -> Server:
    """rust-nostr LocalRelay (nostr-sdk 0.45 bindings), in-memory store (max 75,000 events)."""
    port = port or free_port()
    d = _rundir("localrelay", port)
    py = BENCH / ".venv-localrelay" / "bin" / "python"
    return Server("localrelay", [str(py), str(BENCH / "localrelay_server.py"), "--port",
                                 str(port)], port, d)


def null_server(port: int | None = None, procs: int = 1) -> Server:
    port = port or free_port()
    d = _rundir("null", port)
    return Server("null", [str(PROJECT_PY), str(BENCH / "null_server.py"), "--port", str(port),
                           "--procs", str(procs)], port, d)


FACTORIES = {"ours": ours, "nostr-relay": nostr_relay, "localrelay": localrelay,
             "null": null_server}


def refs_installed() -> dict[str, bool]:
    return {
        "nostr-relay": (BENCH / ".venv-nostr-relay" / "bin" / "nostr-relay").exists(),
        "localrelay": (BENCH / ".venv-localrelay" / "bin" / "python").exists(),
    }


def install_uvloop() -> None:
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def eprint(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


RELAYS = ["ours", "nostr-relay", "localrelay"]


def target_parser(doc: str | None) -> tuple[argparse.ArgumentParser, argparse._MutuallyExclusiveGroup]:
    """An argument parser with the target every bench script takes: --url of a running relay, or --relay NAME."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a relay already running there")
    target.add_argument("--relay", choices=RELAYS, help="start this relay (fresh store) and use it")
    return ap, target


def write_results(name: str, report: dict) -> Path:
    """Write `report` as JSON to bench/results/<name>-<stamp>.json, say where on stderr, and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    eprint(f"wrote {out}")
    return out
