"""Child process of test_kill.py: writes batches of events through the Store with the built-in projectors,
forever, printing "batch N" after each commit, until it is killed.

    python -m tests.store.projectors.kill_writer DB_PATH
"""

from __future__ import annotations

import asyncio
import random
import sys

from relay.config import load_config
from relay.hooks import hooks
from relay.store.store import Store
from tests.helpers import Keys
from tests.store.projectors.common import OPTIONS, event

AUTHORS = [Keys(0x5000 + i) for i in range(40)]


def batch(rng: random.Random, n: int, clock: int, recent: list) -> list:
    """n events: profiles (some malformed), big follow lists, relay lists, articles, notes, deletions."""
    out = []
    for _ in range(n):
        keys = rng.choice(AUTHORS)
        clock += 1
        roll = rng.random()
        if roll < 0.25:
            out.append(event(keys, 0, rng.choice([{"name": f"n{clock}"}, "oops", {"name": clock}]), created_at=clock))
        elif roll < 0.45:
            out.append(event(keys, 3, "", [["p", f"{rng.randrange(500):064x}", "wss://r"] for _ in range(60)], clock))
        elif roll < 0.55:
            out.append(event(keys, 10002, "", [["r", f"wss://{rng.randrange(20)}"] for _ in range(5)], clock))
        elif roll < 0.7:
            out.append(event(keys, 30023, "x", [["d", str(rng.randrange(5))], ["title", "t"],
                                                ["published_at", str(clock)]], clock))
        elif roll < 0.8 and recent:
            target = rng.choice(recent)
            out.append(event(next(k for k in AUTHORS if k.pubkey == target.pubkey), 5, "", [["e", target.id]], clock))
        else:
            out.append(event(keys, 1, f"note {clock}", created_at=clock))
    recent[:] = [e for e in out if e.kind != 5][-50:]
    return out


async def main(path: str) -> None:
    config = load_config(None, {}, {"store": {"path": path}})
    store = await Store.open(path, OPTIONS, hooks(config))
    rng, clock, recent, number = random.Random(1), 1_000, [], 0
    while True:
        events = batch(rng, 300, clock, recent)
        clock += 300
        await asyncio.gather(*[store.submit(e) for e in events])
        number += 1
        print(f"batch {number}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
