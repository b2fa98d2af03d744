"""`relay serve` with `server.workers` > 0: one writer process and its worker processes (issue 16).

How this works: once `relay.assembly.run` holds the database's and the port's
locks, `serve_processes` (this process: the writer) reserves the port with a
socket bound with SO_REUSEPORT but never listening (port 0 thus gives one
port to every worker), starts the writer's `Node` (relay/assembly.py,
`Role.WRITER`: the store with its hooks and the one writer, moderation with
its purges, the expiry purge, retention, memory trim and peer sync, and the
local channel, relay/channel/writer.py, on the runtime directory's
`writer.sock`), then `count` worker processes (relay/worker.py), and logs
`relay_started` once each of them listens.

What the processes share (docs/operating.md, "Limits across processes"): before any
worker starts, the writer makes the metrics directory (prometheus-client's
multiprocess files, which the workers inherit through the environment) and
the per-IP rate-limit table (relay/server/iptable.py) in the runtime
directory, and it keeps the processes file (relay/processes.py) there.

Supervision: a worker that exits while the relay runs is started again
(`worker_restarted`, counted in `relay_worker_restarts_total`, its restarts in
the processes file): its connections are lost, nothing acknowledged is; what
it held in the per-IP table and its live gauges are dropped first.  SIGTERM or SIGINT: every
worker is sent SIGTERM and drains (its connections get the OKs of what they
sent, the writer still answering), past `shutdown_timeout_seconds` it is
killed; then the writer stops as one process does.  The same SIGTERM sent to
the whole process group ends the same way, at any moment of start-up too
(Ctrl-C): workers start with SIGINT and SIGTERM blocked until their loop takes
them, no worker is started again once a stop is asked, and nothing is logged as
started after it.  A writer that fails stops the
relay (exit 1); if this process dies, its workers see the channel close, and
the parent-death signal, and exit (relay/worker.py).
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from relay.assembly import (Node, Role, listen_failed, reuseport_socket, run, serve_until_stopped,
                            start_or_exit_code)
from relay.channel.writer import ChannelServer
from relay.config import Config
from relay.metrics import Metrics, mark_process_dead, start_multiprocess
from relay.processes import PROCESSES_FILE, WorkerProcess, write_processes
from relay.runtime import runtime_dir
from relay.server.iptable import IpTable
from relay.server.ratelimit import create_ip_table
from relay.signals import STOP_SIGNALS
from relay.tuning import tune_after_start, unmap_large_blocks_when_freed

log = structlog.get_logger(__name__)

AUTO_MAX_WORKERS = 8
START_TIMEOUT_SECONDS = 30.0  # for every worker to listen
_RESTART_DELAY_SECONDS = 0.5  # between a worker's death and its restart (a crash loop stays slow)
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def worker_count(workers: int | str) -> int:
    """`server.workers` as a count: "auto" is the CPUs this process may use (its affinity, bounded by the
    cgroup v2 quota, rounded up), at most AUTO_MAX_WORKERS."""
    if workers != "auto":
        return int(workers)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, _cgroup_cpus() or cpus, AUTO_MAX_WORKERS))


def _cgroup_cpus() -> int | None:
    """CPUs of the cgroup v2 quota (`cpu.max`: "QUOTA PERIOD", or "max PERIOD": none), rounded up."""
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


async def serve(config: Config) -> int:
    """`relay serve`: one process when `server.workers` is 0, else a writer and its workers; the exit code."""
    count = worker_count(config.server.workers)
    return await run(config, None if count == 0 else lambda c, stop: serve_processes(c, count, stop))


class WorkerPool:
    """`count` worker processes kept running; `start()`, then `stop(deadline)`.

    Each start or restart rewrites the runtime directory's processes file (`relay status`); a worker that dies
    leaves the shared per-IP table (`ip_table.clear_worker`) and the metrics' live sums (`mark_process_dead`)
    before the next one starts.  None starts again once `stop` (SIGINT or SIGTERM) is set.
    """

    def __init__(self, config_path: Path, port: int, count: int, metrics: Metrics, ip_table: IpTable,
                 runtime: Path, stop: asyncio.Event) -> None:
        self.config_path = config_path
        self.port = port
        self.count = count
        self.metrics = metrics
        self.ip_table = ip_table
        self.runtime = runtime
        self._stop_asked = stop  # SIGINT or SIGTERM
        self.stopping = False
        self.started = time.time()  # the writer's start, for the processes file
        self._procs: dict[int, subprocess.Popen] = {}
        self._states: dict[int, WorkerProcess] = {}
        self._tasks: list[asyncio.Task] = []
        self._waits = ThreadPoolExecutor(count, thread_name_prefix="worker-wait")  # one blocked wait per worker

    def start(self) -> None:
        """Start every worker, each kept running by a task of its own."""
        self._tasks = [asyncio.create_task(self._keep(i), name=f"worker-{i}") for i in range(self.count)]

    async def stop(self, timeout: float) -> None:
        """SIGTERM every worker; those still running after `timeout` seconds get SIGKILL."""
        self.stopping = True
        for proc in self._procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), timeout)
        except TimeoutError:
            for index, proc in self._procs.items():
                if proc.returncode is None:
                    log.warning("worker_killed", worker=index, waited_seconds=timeout)
                    proc.kill()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._waits.shutdown(wait=False)

    def _ends(self) -> bool:
        """Whether the relay stops (so a worker that exits is not started again)."""
        return self.stopping or self._stop_asked.is_set()

    async def _keep(self, index: int) -> None:
        restarts = 0
        while True:
            proc = _spawn_worker([sys.executable, "-m", "relay.worker", str(self.config_path), str(index),
                                  str(self.port), str(self.count)])
            self._procs[index] = proc
            self._states[index] = WorkerProcess(index, proc.pid, time.time(), restarts)
            self._write_processes()
            code = await asyncio.get_running_loop().run_in_executor(self._waits, proc.wait)
            self.ip_table.clear_worker(index)  # its connections' places and unsent bytes, per IP
            if self.metrics.multiprocess_dir is not None:
                mark_process_dead(proc.pid, self.metrics.multiprocess_dir)
            if self._ends():
                return
            await asyncio.sleep(_RESTART_DELAY_SECONDS)  # (a crash loop stays slow; a stop asked meanwhile is seen)
            if self._ends():
                return
            restarts += 1
            self.metrics.worker_restarts.inc()
            log.warning("worker_restarted", worker=index, exit_code=code)

    def _write_processes(self) -> None:
        try:
            write_processes(self.runtime, os.getpid(), self.started, list(self._states.values()))
        except OSError as exc:  # only `relay status` misses it
            log.warning("processes_file_failed", error=str(exc))


class Processes:
    """The writer's side of `count` workers, for `serve_processes` and tests: `await start(stop)`, `await stop()`.

    After a successful start: `node` (the writer's `Node`, no server), `port` (the port the workers share),
    `url`.  `metrics_dir`: the metrics directory `start_multiprocess` made (None: the writer's metrics are its
    own, and each worker's its own: a writer inside a test's process).
    """

    def __init__(self, config: Config, count: int, metrics_dir: Path | None = None) -> None:
        self.config = config
        self.count = count
        self.node = Node(config, Role.WRITER, Metrics(metrics_dir, writer=True), port=lambda: self.port)
        self.port = 0
        self._reserved: socket.socket | None = None
        self._pool: WorkerPool | None = None
        self._ip_table: IpTable | None = None
        self._runtime = runtime_dir(config.store.path)
        self._config_path = self._runtime / "config.pickle"

    @property
    def url(self) -> str:
        """ws://host:port of the relay."""
        return f"ws://{self.config.server.host}:{self.port}"

    async def start(self, stop: asyncio.Event | None = None) -> int | None:
        """Reserve the port, start the writer's node, the channel and the workers; None once every worker
        listens, else the exit code (the failure logged, what had started stopped again).  `stop` (SIGINT or
        SIGTERM), once set, starts nothing more and ends the wait for the workers (None: `stop()` follows)."""
        config = self.config
        stop = stop or asyncio.Event()
        try:
            self._reserved = reuseport_socket(config.server.host, config.server.port)
        except OSError as exc:
            return listen_failed(config, exc)
        self.port = self._reserved.getsockname()[1]
        if (code := await start_or_exit_code(self.node)) is not None:
            self._reserved.close()
            return code
        if stop.is_set():
            return None
        self._config_path.write_bytes(pickle.dumps(config))
        self._ip_table = create_ip_table(self._runtime, config.rate_limits, self.count)  # before any worker opens it
        self._pool = WorkerPool(self._config_path, self.port, self.count, self.node.metrics, self._ip_table,
                                self._runtime, stop)
        self._pool.start()
        if not await _wait_for_workers(self.node.channel, self.count, stop):
            await self.stop()
            return 1
        return None

    async def stop(self) -> None:
        """Stop the workers (they drain, the writer still answering), then the writer's node (its channel too)."""
        if self._pool is not None:
            await self._pool.stop(self.config.server.shutdown_timeout_seconds + 5.0)
            (self._runtime / PROCESSES_FILE).unlink(missing_ok=True)
        if self._ip_table is not None:
            self._ip_table.close()
        await self.node.stop()
        if self._reserved is not None:
            self._reserved.close()
        self._config_path.unlink(missing_ok=True)


async def serve_processes(config: Config, count: int, stop: asyncio.Event) -> int:
    """The writer process of `count` workers (see the module): serve until `stop` (SIGINT/SIGTERM); the exit
    code."""
    unmap_large_blocks_when_freed()
    processes = Processes(config, count, start_multiprocess(runtime_dir(config.store.path)))
    if (code := await processes.start(stop)) is not None:
        return code
    if not stop.is_set():  # (a stop asked while it started: it is not said to have started)
        tune_after_start(serves_clients=False)
        log.info("relay_started", url=processes.url, db=str(config.store.path), workers=count)
    code = await serve_until_stopped(processes.node, stop)
    await processes.stop()
    return code


async def _wait_for_workers(channel: ChannelServer, count: int, stop: asyncio.Event) -> bool:
    """True once `count` workers said hello, or as soon as `stop` is set; False, logged, past
    START_TIMEOUT_SECONDS."""
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_SECONDS
    while len(channel.workers) < count and not stop.is_set():
        channel.ready.clear()
        waits = {asyncio.create_task(channel.ready.wait()), asyncio.create_task(stop.wait())}
        done, _ = await asyncio.wait(waits, timeout=deadline - asyncio.get_running_loop().time(),
                                     return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if not done:
            log.error("workers_not_started", started=len(channel.workers), workers=count)
            return False
    return True


def _spawn_worker(args: list[str]) -> subprocess.Popen:
    """Start a worker process with SIGINT and SIGTERM blocked (a mask survives fork and exec): a stop signal
    that reaches it before its loop can take it (its interpreter starting, its imports; Ctrl-C reaches the
    whole process group) waits for `stop_on_signals` in `serve_worker`, where Python would raise
    KeyboardInterrupt.  (uvloop's subprocesses start with every signal unblocked, hence subprocess.Popen.)"""
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
