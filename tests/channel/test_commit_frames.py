"""A `commit` frame names the change feed's head after the commit (the largest position committed with an
insertion), so an idle worker's follower moves its cursor there without reading the feed: a real ChannelServer
on a real store, a worker's WriterChannel over its Unix socket."""

from __future__ import annotations

import asyncio

from relay.channel.frames import socket_path
from relay.channel.worker import WriterChannel
from relay.channel.writer import ChannelServer
from relay.ingest import Ingest
from relay.node import open_store
from tests.conftest import make_config
from tests.helpers import eventually, store_events


def _nothing(*args) -> None:
    """No ephemeral events or moderation changes here."""


async def test_each_commit_frame_names_the_feed_head(tmp_path, alice):
    """Three commits, one after the other: the frames name each one's head, the feed's, never 0."""
    config = make_config(tmp_path)
    store = await open_store(config, 1)
    channel = ChannelServer(socket_path(config.store.path), Ingest.from_config(config, store))
    store.add_listener(channel.on_commit)
    await channel.start()
    heads: list[int] = []
    worker = WriterChannel(socket_path(config.store.path), 10, lambda head: head is None or heads.append(head),
                           _nothing, _nothing)
    reading = None
    try:
        await worker.connect()
        reading = asyncio.create_task(worker.run())
        worker.hello(0)
        assert await eventually(lambda: len(channel.workers) == 1)
        expected = []
        for i in range(3):
            await store_events(store, [alice.sign(content=f"commit {i}")])
            expected.append(await store.head())
            assert await eventually(lambda: heads[-1:] == expected[-1:]), heads
        assert heads == expected and 0 not in heads
    finally:
        worker.close()
        await channel.close()
        if reading is not None:
            reading.cancel()
        await store.close()
