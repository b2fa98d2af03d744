"""The feed follower of a worker: what it delivers, and that an idle worker reads nothing of the feed."""

from __future__ import annotations

import asyncio

from relay.channel.follower import FeedFollower
from relay.store.store import Store
from tests.helpers import Keys, eventually, store_events

KEYS = Keys(7)


async def _follower(tmp_path, idle: list[bool]):
    store = await Store.open(tmp_path / "relay.db")
    delivered: list[tuple[str, int]] = []
    follower = FeedFollower(store, lambda events, seqs: delivered.extend(zip((e.id for e in events), seqs)),
                            lambda: idle[0])
    await follower.start()
    return store, follower, delivered


async def test_with_subscriptions_each_commit_is_delivered_once_with_its_position(tmp_path):
    store, follower, delivered = await _follower(tmp_path, [False])
    events = [KEYS.sign(content=f"note {i}", created_at=1_700_000_000 + i) for i in range(5)]
    await store_events(store, events)
    follower.wake(await store.head())
    follower.wake(None)  # a heartbeat after it reads nothing twice
    assert await eventually(lambda: len(delivered) == 5)
    await asyncio.sleep(0.1)
    assert sorted(i for i, _ in delivered) == sorted(e["id"] for e in events)
    assert [s for _, s in delivered] == sorted(s for _, s in delivered)
    follower.stop()
    await store.close()


async def test_an_idle_worker_moves_its_cursor_to_the_head_without_reading(tmp_path):
    idle = [True]
    store, follower, delivered = await _follower(tmp_path, idle)
    await store_events(store, [KEYS.sign(content="before", created_at=1_700_000_000)])
    head = await store.head()
    follower.wake(head)
    assert await eventually(lambda: follower.cursor == head)
    assert delivered == []
    idle[0] = False  # a subscription opens: what is committed from now on is delivered
    later = KEYS.sign(content="after", created_at=1_700_000_001)
    await store_events(store, [later])
    follower.wake(await store.head())
    assert await eventually(lambda: [i for i, _ in delivered] == [later["id"]])
    follower.stop()
    await store.close()
