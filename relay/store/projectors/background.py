"""Builds of projectors while the relay serves: each step of a `build.Build` is one job of the store's writer."""

from __future__ import annotations

import sqlite3

from relay.store.projectors.build import Build
from relay.store.store import Store
from relay.store.writes import Changes


def _step_job(conn: sqlite3.Connection, hooks: object, build: Build) -> tuple[Changes, bool]:
    # `Store.run_job` form of one step: no event changed, so no listener has anything to do.
    return Changes(), build.step(conn)


async def build_in_background(store: Store, builds: list[Build]) -> None:
    """Run `builds` to the end, one step per writer job (`Store.run_retried`: a failing step is tried again with
    back-off, and listed by `relay status`): the client writes queued while a step runs commit before the next one.

    Raises:
        StoreFailed: the writer failed (the relay stops).
    """
    for build in builds:
        while not await store.run_retried(f"build of projector {build.target.name}", _step_job, build):
            pass
