"""`Relay(config)`: a whole node (relay/assembly.py `Node`) in the test's process, as the tests start and inspect it.

With RELAY_TEST_WORKERS=N (N > 0), the node is the writer of N worker processes (relay/supervisor.py
`Processes`), which serve the port: what a test reads of the server itself (its connections, counters)
is then in the workers, out of reach, and such tests fail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from relay.config import Config
from relay.node import Node
from tests.served import TEST_WORKERS


class Relay:
    """A `Node` with `start()`/`stop()`; `sync` is the node's, every other attribute its server's
    (`store`, `ingest`, `metrics`, `url`, `connections`, `slow_readers`, `server`: websockets' `Server`, ...)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.processes = None
        if int(TEST_WORKERS) > 0:
            from relay.supervisor import Processes

            self.processes = Processes(config, int(TEST_WORKERS))
            self.node = self.processes.node
        else:
            self.node = Node(config)

    async def start(self) -> None:
        """Open the store and serve on the configured port (0: any free one), then start peer sync."""
        if self.processes is None:
            await self.node.start()
        elif await self.processes.start() is not None:
            raise RuntimeError("the writer of the worker processes did not start (see the log)")

    async def stop(self) -> None:
        """Graceful shutdown, as `relay serve` does on SIGTERM."""
        await (self.node.stop() if self.processes is None else self.processes.stop())

    @property
    def sync(self):
        """The node's `[[sync.peers]]` scheduler (None without peers)."""
        return self.node.sync

    def __getattr__(self, name: str):
        if self.processes is not None:  # the writer's parts; the server's are in the workers
            if name in ("url", "port"):
                return getattr(self.processes, name)
            return getattr(self.node, name)
        return getattr(self.node.server, name)


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[Relay]:
    """A started in-process relay of `config`, stopped on leaving."""
    relay = Relay(config)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()
