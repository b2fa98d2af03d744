"""`Relay(config)`: a whole node (relay/node.py) in the test's process, as the tests start and inspect it."""

from __future__ import annotations

from relay.config import Config
from relay.node import Node


class Relay:
    """A `Node` with `start()`/`stop()`; `sync` is the node's, every other attribute its server's
    (`store`, `ingest`, `metrics`, `url`, `connections`, `slow_readers`, `server`: websockets' `Server`, ...)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.node = Node(config)

    async def start(self) -> None:
        """Open the store and serve on the configured port (0: any free one), then start peer sync."""
        await self.node.start()

    async def stop(self) -> None:
        """Graceful shutdown, as `relay serve` does on SIGTERM."""
        await self.node.stop()

    @property
    def sync(self):
        """The node's `[[sync.peers]]` scheduler (None without peers)."""
        return self.node.sync

    def __getattr__(self, name: str):
        return getattr(self.node.server, name)
