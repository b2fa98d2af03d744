"""The writer answers a worker's store job (NIP-86 management) only once every worker has read the
moderation lists again: a real ChannelServer on a real store, workers' WriterChannels over its Unix socket."""

from __future__ import annotations

import asyncio

from relay.channel.frames import socket_path
from relay.channel.worker import WriterChannel
from relay.channel.writer import ChannelServer
from relay.ingest import Ingest
from relay.node import open_store
from relay.store.writes import Changes
from tests.conftest import make_config
from tests.helpers import eventually


def _job(conn, hooks) -> tuple[Changes, str]:
    """A store job that changes nothing (pickled by name across the channel)."""
    return Changes(), "done"


def _nothing(*args) -> None:
    """A worker here gets no commits or ephemeral events."""


async def test_a_job_is_answered_after_every_worker_read_the_lists_again(tmp_path):
    """Worker 0 runs a job while worker 1 is still reading the lists: no answer until worker 1 has read
    them; worker 0's own reload is waited for too."""
    config = make_config(tmp_path)
    store = await open_store(config, 1)
    channel = ChannelServer(socket_path(config.store.path), Ingest.from_config(config, store))
    await channel.start()
    released = {0: asyncio.Event(), 1: asyncio.Event()}
    reloads = []

    def worker(index: int) -> WriterChannel:
        async def reload() -> None:
            reloads.append(index)
            await released[index].wait()
        return WriterChannel(socket_path(config.store.path), 10, _nothing, _nothing, reload)

    workers = [worker(0), worker(1)]
    running = []
    try:
        for index, w in enumerate(workers):
            await w.connect()
            running.append(asyncio.create_task(w.run()))
            w.hello(index)
        assert await eventually(lambda: len(channel.workers) == 2)
        job = asyncio.create_task(workers[0].run_job(_job))
        assert await eventually(lambda: sorted(reloads) == [0, 1])
        released[0].set()
        await asyncio.sleep(0.2)  # worker 0 has answered; worker 1 has not
        assert not job.done()
        released[1].set()
        assert await asyncio.wait_for(job, 5) == "done"
    finally:
        for w in workers:
            w.close()
        await channel.close()
        for task in running:
            task.cancel()
        await store.close()
