"""Convergence (docs/architecture.md, invariant 3), property-tested: the same events, replacements and deletions in any
order, and a store whose projectors were added after its events (backfill at start-up), give byte-identical
projected tables, and `verify` is clean on every store."""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.store.projectors import BUILTIN_PROJECTORS
from tests.helpers import Keys
from tests.store.projectors.common import dumps, event, open_store, problems, submit_batches

AUTHORS = [Keys(0x1000 + i) for i in range(3)]


def _pool() -> list:
    """A fixed set of signed events: versions with created_at ties, malformed profiles, repeated tags,
    e- and a-deletions (some of deleted versions, one of a deletion), an expired version, unprojected kinds."""
    rng = random.Random(7)
    events = []
    for i, keys in enumerate(AUTHORS):
        other = AUTHORS[(i + 1) % 3].pubkey
        profiles = [event(keys, 0, {"name": f"n{i}", "about": "first"}, created_at=100),
                    event(keys, 0, {"name": f"m{i}", "picture": "p"}, created_at=200),
                    event(keys, 0, {"name": f"t{i}", "lud16": "tie"}, created_at=200),  # tie: lowest id wins
                    event(keys, 0, "not json" if i == 0 else {"name": 7}, created_at=(150, 350, 120)[i])]
        follows = [event(keys, 3, "", [["p", other, "wss://r", "pal"], ["p", "aa"], ["p", other, "wss://dup"]], 100),
                   event(keys, 3, "", [["p", "bb"], ["p", "cc", "", "c"]] + [["p", f"{n:02x}"] for n in range(5)], 300)]
        relays = [event(keys, 10002, "", [["r", "wss://a", "read"], ["r", "wss://b"], ["r", "wss://a", "write"]], 100),
                  event(keys, 10002, "", [["r", "wss://c", "write"]], 90)]
        articles = [event(keys, 30023, "body", [["d", "post"], ["title", "v1"], ["published_at", "1700000000"]], 100),
                    event(keys, 30023, "body", [["d", "post"], ["title", "v2"], ["summary", "s"]], 250),
                    event(keys, 30023, "body", [["d", "other"], ["image", "i"], ["published_at", "soon"]], 100),
                    event(keys, 30023, "no d tag", [["title", "undated"]], 120)]
        notes = [event(keys, 1, f"note {n}", created_at=100 + n) for n in range(2)]
        expiring = [event(keys, 0, {"name": "short-lived"}, [["expiration", "1000"]], 260)] if i == 0 else []
        events += profiles + follows + relays + articles + notes + expiring
        deleted = [profiles[(2, 1, 0)[i]].id, notes[rng.randrange(2)].id] + ([follows[1].id] if i == 0 else [])
        deletion = event(keys, 5, "", [["e", target] for target in deleted], 400)
        events += [deletion,
                   event(keys, 5, "", [["a", f"30023:{keys.pubkey}:post"]], 150),  # deletes v1 only
                   event(keys, 5, "", [["e", deletion.id]], 500)]  # a deletion of a deletion: no effect
    return events


POOL = _pool()


async def _fill(path: Path, events: list, sizes: list[int], backfill_after: int | None) -> None:
    """Write `events` in batches of `sizes`; with `backfill_after`, the first that many go in with no projector,
    the store is closed, and the projectors are added at the next start (rebuilt from the events)."""
    cut = len(events) if backfill_after is None else backfill_after
    store, _ = await open_store(path, () if backfill_after is not None else BUILTIN_PROJECTORS)
    await submit_batches(store, events[:cut], sizes)
    if backfill_after is not None:
        await store.close()
        store, hook = await open_store(path)
        assert len(hook.rebuilt) == len(BUILTIN_PROJECTORS)
    await submit_batches(store, events[cut:], sizes[::-1])
    await store.purge_expired()
    await store.close()


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_order_and_backfill_give_identical_tables(data):
    """Two stores, the same events in different orders and batchings, one of them backfilled: same bytes."""
    chosen = data.draw(st.lists(st.booleans(), min_size=len(POOL), max_size=len(POOL)), label="kept")
    events = [e for e, keep in zip(POOL, chosen) if keep or e.kind == 5]
    order_a = data.draw(st.permutations(events), label="order A")
    order_b = data.draw(st.permutations(events), label="order B")
    sizes_a = data.draw(st.lists(st.integers(1, 12), max_size=8), label="batches A")
    sizes_b = data.draw(st.lists(st.integers(1, 12), max_size=8), label="batches B")
    cut = data.draw(st.integers(0, len(events)), label="events before the projectors exist")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a.db", Path(tmp) / "b.db"

        async def run():
            await _fill(a, list(order_a), sizes_a, None)
            await _fill(b, list(order_b), sizes_b, cut)

        asyncio.run(run())
        assert problems(a, BUILTIN_PROJECTORS) == []
        assert problems(b, BUILTIN_PROJECTORS) == []
        assert dumps(a, BUILTIN_PROJECTORS) == dumps(b, BUILTIN_PROJECTORS)


def test_full_backfill_equals_live_projection(tmp_path):
    """Every event written before any projector exists, then projected at start-up: same tables as live."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"

    async def run():
        await _fill(a, POOL, [5] * 20, None)
        await _fill(b, POOL[::-1], [50], len(POOL))

    asyncio.run(run())
    assert problems(a, BUILTIN_PROJECTORS) == [] and problems(b, BUILTIN_PROJECTORS) == []
    tables = dumps(a, BUILTIN_PROJECTORS)
    assert tables == dumps(b, BUILTIN_PROJECTORS)
    assert all(tables[t] for t in ("profiles", "follows", "relay_lists", "articles"))  # not trivially empty
