"""One worker process of `relay serve` with `server.workers` > 0: `python -m relay.worker CONFIG INDEX PORT COUNT`.

How this works: the writer process (relay/supervisor.py) starts COUNT of
these, giving each the pickled configuration's path, its index and the
port it reserved.  A worker binds the same address with SO_REUSEPORT (the
kernel spreads new connections over the workers), opens the store for
reading only (`Store.open_reader`: its own read connections, no writer, no
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
import socket
import sys
from http import HTTPStatus
from pathlib import Path

import structlog

from relay.channel.follower import FeedFollower
from relay.channel.frames import socket_path
from relay.channel.worker import WriterChannel
from relay.config import Config, worker_config
from relay.hooks import hooks
from relay.ingest import Ingest
from relay.ingest.moderation import Moderation
from relay.logging import configure_logging
from relay.metrics import CONTENT_TYPE, Metrics, inherited_multiprocess
from relay.node import (add_status_page, start_memory_trim, stop_on_signals, tune_after_start,
                        unmap_large_blocks_when_freed)
from relay.processes import die_with_parent
from relay.runtime import runtime_dir
from relay.server.app import RelayServer
from relay.server.ratelimit import open_ip_table
from relay.wire.http import HttpRequest, HttpResponse
from relay.store.store import Store

log = structlog.get_logger("relay.worker")  # (not __name__: run as __main__, outside the "relay" logger)

HEALTHY_WITHIN_SECONDS = 1.0  # /health: a frame from the writer this recently


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` with SO_REUSEPORT, not listening (port 0: a free one).

    The writer process holds one, never listening, so that the port stays the relay's (port 0 gives one
    port to every worker); each worker binds its own and listens.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _die_with_parent() -> None:
    """Ask Linux for SIGUSR1 when the parent (the writer process) dies, however it dies; elsewhere nothing."""
    die_with_parent(signal.SIGUSR1)


async def serve_worker(config: Config, index: int, port: int, count: int) -> int:
    """Serve as worker `index` of `count` on `port` until stopped; returns the exit code (see the module)."""
    structlog.contextvars.bind_contextvars(worker=index)
    config = worker_config(config, count)  # its part of the relay-wide memory budgets
    loop = asyncio.get_running_loop()
    stop, lost = stop_on_signals(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, lost.set)
    store = await Store.open_reader(config.store.path, config.store.options(None, config.server.public_url),
                                    hooks(config))  # (their indexes are read here: NIP-77, NIP-50)
    moderation = await Moderation.open(store, config)
    ingest = Ingest.from_config(config, store, moderation=moderation)
    metrics = Metrics(inherited_multiprocess(), writer=False)  # (the shared directory joined first)
    ip_table = open_ip_table(runtime_dir(config.store.path), config.rate_limits, index)

    async def metrics_page(request: HttpRequest) -> HttpResponse:
        return HttpResponse(HTTPStatus.OK, await metrics.render(), CONTENT_TYPE)

    server = RelayServer(config, store, ingest, metrics, metrics_page, ip_table)
    add_status_page(server, moderation)
    follower = FeedFollower(store, server.fanout, server.subscriptions.empty)
    channel = WriterChannel(socket_path(config.store.path), config.store.writer_queue_size, follower.wake,
                            lambda event: server.fanout([event]), moderation.load)
    await channel.connect()
    store.forward_job = channel.run_job  # NIP-86 changes: the writer process runs them
    ingest.sink, ingest.wait_for_room = channel.submit, channel.wait_for_room
    ingest.live = None  # ephemeral events come back from the writer, to every worker at once
    server.health = lambda: _health(channel, count, index)
    server.server_header = {"server_header": f"relay worker {index}"}
    await follower.start()  # the feed's head, before any subscription can exist here
    if not stop.is_set():  # (a stop asked while it started: it neither listens nor says it started)
        await server.listen(reuseport_socket(config.server.host, port))
    code, deadline, tasks = 0, loop.time(), []
    if not stop.is_set():
        metrics.watch(store, server, None)
        metrics.watch_policies(ingest.policies)
        tasks = [asyncio.create_task(channel.run(), name="channel"),
                 asyncio.create_task(moderation.refresh_forever(), name="moderation-refresh")]
        if metrics.multiprocess_dir is not None:
            tasks.append(asyncio.create_task(metrics.refresh_forever(), name="metrics-refresh"))
        if (trim := start_memory_trim(config)) is not None:
            tasks.append(trim)
        tune_after_start()
        channel.hello(index)
        log.info("worker_started", url=server.url, port=server.port)
        code, deadline = await _until_stopped(stop, lost, tasks[0], config.server.shutdown_timeout_seconds)
    await server.close(deadline)  # (the channel still runs: the drained connections get their OKs through it)
    for task in tasks:
        task.cancel()
    follower.stop()
    channel.close()
    moderation.close()
    await store.close()
    await ingest.aclose()
    ip_table.close()
    log.info("worker_stopped", exit_code=code)
    return code


async def _until_stopped(stop: asyncio.Event, lost: asyncio.Event, channel: asyncio.Task,
                         drain_seconds: float) -> tuple[int, float]:
    """Wait for a stop signal, or for the writer's loss (`lost`: the parent-death signal, or `channel` ended);
    the exit code and the loop time to drain connections until (none when the writer is gone)."""
    loop = asyncio.get_running_loop()
    stopped, writer_gone = asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())
    await asyncio.wait({stopped, writer_gone, channel}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    writer_gone.cancel()
    if stop.is_set():
        return 0, loop.time() + drain_seconds
    log.error("writer_lost", hint="the writer process is gone: this worker stops, as nothing it takes could "
                                  "be acknowledged")
    return 1, loop.time()  # no drain: no OK can come


def _health(channel: WriterChannel, count: int, index: int) -> tuple[bool, dict]:
    healthy = channel.reached_within(HEALTHY_WITHIN_SECONDS)
    return healthy, {"writer": "ok" if healthy else "unreachable", "workers": count, "worker": index}


def main(argv: list[str] | None = None) -> int:
    """The worker process's entry point (argv: CONFIG_PICKLE INDEX PORT COUNT); returns its exit code."""
    import uvloop

    config_path, index, port, count = argv if argv is not None else sys.argv[1:]
    _die_with_parent()
    unmap_large_blocks_when_freed()
    config: Config = pickle.loads(Path(config_path).read_bytes())
    configure_logging(config.log.level, config.log.format)
    os.nice(config.server.worker_nice)
    return uvloop.run(serve_worker(config, int(index), int(port), int(count)))


if __name__ == "__main__":
    raise SystemExit(main())
