"""One worker process of `relay serve` with `server.workers` > 0: `python -m relay.worker CONFIG INDEX PORT COUNT`.

How this works: the writer process (relay/supervisor.py) starts COUNT of
these, giving each the pickled configuration's path, its index and the
port it reserved.  The worker's parts are built by relay/assembly.py
(`Node` with `Role.WORKER`): it binds the same address with SO_REUSEPORT (the
kernel spreads new connections over the workers), opens the database for
reading only (`ReadPool`: its own read connections, no writer, no
hooks), runs with its part of the relay-wide memory budgets
(`worker_config`), the per-IP limits of the table all workers share and the
metrics directory they share (relay/supervisor.py made both), and serves
WebSocket and HTTP as one process would, except that
ingest's last stage is the local channel to the writer (relay/channel/
worker.py: the writer runs the `[[policies]]` and commits, and the OK waits
for its answer) and live events come from the change feed
(relay/channel/follower.py) and the writer's `ephemeral` frames.

It stops on SIGTERM or SIGINT (stops accepting, each connection gets the
OKs of the events it took, exit 0), and at once with exit 1 when the
channel closes or the writer process dies (`writer_lost`; SIGUSR1 is the
parent-death signal, a second guard): nothing it took could be acknowledged.
The writer starts it with SIGTERM and SIGINT blocked, taken once its loop
runs: one that came earlier stops it then, before it listens or says it started.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from pathlib import Path

import structlog

from relay.assembly import Node, Role, Seat, serve_until_stopped
from relay.config import Config, worker_config
from relay.logging import configure_logging
from relay.metrics import Metrics, inherited_multiprocess
from relay.processes import die_with_parent
from relay.signals import stop_on_signals
from relay.tuning import tune_after_start, unmap_large_blocks_when_freed

log = structlog.get_logger("relay.worker")  # (not __name__: run as __main__, outside the "relay" logger)


async def serve_worker(config: Config, index: int, port: int, count: int) -> int:
    """Serve as worker `index` of `count` on `port` until stopped; returns the exit code (see the module)."""
    structlog.contextvars.bind_contextvars(worker=index)
    stop, lost = stop_on_signals(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lost.set)  # the parent-death signal
    node = Node(worker_config(config, count),  # its part of the relay-wide memory budgets
                Role.WORKER, Metrics(inherited_multiprocess(), writer=False), Seat(index, count, port))
    await node.start()
    code = 0
    if not stop.is_set():  # (a stop asked while it started: it does not say it started)
        tune_after_start()
        log.info("worker_started", url=node.url, port=node.port)
        code = await serve_until_stopped(node, stop, lost)
    await node.stop(drain=code == 0)  # (no drain once the writer is gone: no OK can come)
    log.info("worker_stopped", exit_code=code)
    return code


def main(argv: list[str] | None = None) -> int:
    """The worker process's entry point (argv: CONFIG_PICKLE INDEX PORT COUNT); returns its exit code."""
    import uvloop

    config_path, index, port, count = argv if argv is not None else sys.argv[1:]
    die_with_parent(signal.SIGUSR1)  # Linux sends it when the writer process dies, however it dies
    unmap_large_blocks_when_freed()
    config: Config = pickle.loads(Path(config_path).read_bytes())
    configure_logging(config.log.level, config.log.format)
    os.nice(config.server.worker_nice)
    return uvloop.run(serve_worker(config, int(index), int(port), int(count)))


if __name__ == "__main__":
    raise SystemExit(main())
